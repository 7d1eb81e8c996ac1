"""On PYTHONPATH, every Python process started with it sees no horovod: importing it raises
ModuleNotFoundError and its package metadata is not found - as on a machine where it was
never installed. The venv under test is left as it is."""

import importlib.abc
import importlib.metadata
import sys


class _NoHorovod(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "horovod" or fullname.startswith("horovod."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


sys.meta_path.insert(0, _NoHorovod())
_version, _distribution = importlib.metadata.version, importlib.metadata.distribution


def _hidden(name):
    if str(name).lower().replace("_", "-") == "horovod":
        raise importlib.metadata.PackageNotFoundError(name)


def version(name):
    _hidden(name)
    return _version(name)


def distribution(name):
    _hidden(name)
    return _distribution(name)


importlib.metadata.version, importlib.metadata.distribution = version, distribution
