"""The notebooks' demo data and image helpers - the digits splits, a synthetic flowers set, the
image table and its decode - kept apart from the library: no module of hvdrunner outside
this package imports it (tests/test_layers.py), the notebooks and benchmarks do.

- ``datasets``: the digits source, its train/test splits and where they are written.
- ``images``: image files as a Spark table, the decode that runs on the ranks.
"""
