"""The rank-process import guard: installed first thing in every rank, before user code.

A leaf over :mod:`hvdrunner._versions` (no TensorFlow, Keras or Horovod import), so a rank
of any framework pays nothing for it.

- Keras 3: importing Horovod's Keras layer (``horovod.tensorflow.keras`` and friends), which
  trains ranks *unsynchronized without an error* there, raises ``ImportError`` with the fix.
- tf_keras mode: ``import keras`` gives ``tf_keras`` (the Keras that ``tf.keras`` is in this
  mode), so Horovod's Keras layer works unchanged.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

from hvdrunner._versions import mode, tensorflow

HOROVOD_KERAS_MODULES = ("horovod.tensorflow.keras", "horovod.keras", "horovod._keras")

KERAS3_HOROVOD_ERROR = (
    "{module} cannot be used here: tf.keras is Keras 3 (TensorFlow {tf}), where Horovod's "
    "Keras layer does not average gradients (ranks silently train apart). Fix, either: "
    "(1) change the import to `import hvdrunner.hvd_keras as hvd` (same names: init, "
    "DistributedOptimizer, callbacks.BroadcastGlobalVariablesCallback, ...), or "
    "(2) run with Keras 2: pip install tf_keras and set TF_USE_LEGACY_KERAS=1 (e.g. "
    "os.environ['TF_USE_LEGACY_KERAS'] = '1' before HorovodRunner.run), then "
    "horovod.tensorflow.keras works unchanged."
)


class _HorovodKerasBlocker(importlib.abc.MetaPathFinder):
    """Makes importing Horovod's Keras layer (``horovod.tensorflow.keras`` and friends) fail."""

    def __init__(self, tf_version: str) -> None:
        self.tf_version = tf_version

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        for name in HOROVOD_KERAS_MODULES:
            if fullname == name or fullname.startswith(name + "."):
                raise ImportError(
                    KERAS3_HOROVOD_ERROR.format(module=name, tf=self.tf_version), name=fullname
                )
        return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Already executed as its real self; the import system just overwrote its __spec__
        # with the alias's, so put the real one back.
        module.__spec__ = self._real_spec


class _KerasToTfKeras(importlib.abc.MetaPathFinder):
    """``import keras`` / ``keras.x`` resolve to ``tf_keras`` / ``tf_keras.x`` (tf_keras mode)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "keras" or fullname.startswith("keras."):
            real = "tf_keras" + fullname[len("keras") :]
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))
        return None


def install_import_guard() -> str:
    """Called first thing in every rank process. Returns the Keras mode it acted on.

    - ``keras3``: importing Horovod's Keras layer raises ``ImportError`` naming the fix.
    - ``tf_keras``: ``import keras`` gives ``tf_keras`` (Keras 2), the Keras that ``tf.keras``
      is in this mode, so Horovod's Keras layer (``from keras import backend``) works.
    - ``keras2`` (or no TensorFlow): nothing to do.
    """
    current = mode()
    if current == "keras3":
        already = [m for m in HOROVOD_KERAS_MODULES if m in sys.modules]
        if already:  # pragma: no cover - a rank starts from a fresh interpreter
            raise ImportError(KERAS3_HOROVOD_ERROR.format(module=already[0], tf="2.16+"))
        sys.meta_path.insert(0, _HorovodKerasBlocker(tensorflow() or "?"))
    elif current == "tf_keras" and "keras" not in sys.modules:
        sys.meta_path.insert(0, _KerasToTfKeras())
    return current
