"""Put first on PYTHONPATH, this makes ``import horovod`` fail as on a machine without it
(the venv under test is left as it is)."""

raise ImportError("No module named 'horovod' (tests/helpers/no_horovod: horovod made unimportable)")
