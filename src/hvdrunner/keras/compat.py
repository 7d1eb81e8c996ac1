"""Which Keras is ``tf.keras`` here, and the few places where Keras 2 and Keras 3 differ.

Two generations are supported:

- **Keras 2**: TensorFlow <= 2.15 (``tf.keras`` is the ``keras`` 2.x package), or TensorFlow
  >= 2.16 with ``TF_USE_LEGACY_KERAS=1`` and ``tf_keras`` installed ("tf_keras mode").
- **Keras 3**: TensorFlow >= 2.16 by default. Only ``KERAS_BACKEND=tensorflow`` works:
  Horovod's collectives here are TensorFlow ops.

Horovod's own Keras layer (``horovod.tensorflow.keras``, ``horovod._keras``) trains
*unsynchronized without an error* under Keras 3. hvdrunner never imports it; inside a rank,
:func:`install_import_guard` makes importing it fail fast with the fix, and in tf_keras
mode it steers ``import keras`` to ``tf_keras`` so that Horovod's Keras layer works unchanged.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as md
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

LEGACY_ENV = "TF_USE_LEGACY_KERAS"
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


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[int, int]:
    parts = (version.split(".") + ["0", "0"])[:2]
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def legacy_requested() -> bool:
    """``TF_USE_LEGACY_KERAS`` is set to a true value (TensorFlow's own reading of it)."""
    return os.environ.get(LEGACY_ENV, "").strip().lower() in ("1", "true", "yes")


def generation() -> int | None:
    """2 or 3: the Keras generation ``tf.keras`` resolves to, from installed versions only.

    Cheap (no TensorFlow import), so the launcher can decide before any rank starts.
    ``None`` when TensorFlow is not installed.

    Example:
        >>> generation() in (2, 3, None)
        True
    """
    tf = _version("tensorflow") or _version("tensorflow-cpu")
    if tf is None:
        return None
    if _major_minor(tf) < (2, 16):
        return 2
    if legacy_requested() and _version("tf_keras") is not None:
        return 2
    return 3


def mode() -> str:
    """``"keras2"`` (TF <= 2.15), ``"tf_keras"`` (legacy mode on TF >= 2.16) or ``"keras3"``."""
    tf = _version("tensorflow") or _version("tensorflow-cpu") or "0"
    gen = generation()
    if gen == 3:
        return "keras3"
    return "tf_keras" if _major_minor(tf) >= (2, 16) else "keras2"


def check_backend() -> None:
    """Refuse a Keras 3 backend other than TensorFlow (Horovod's ops here are TF ops)."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow").strip().lower()
    if generation() == 3 and backend not in ("", "tensorflow"):
        raise RuntimeError(
            f"KERAS_BACKEND={backend!r}: hvdrunner trains with Horovod's TensorFlow ops, so "
            f"Keras 3 must use the TensorFlow backend. Unset KERAS_BACKEND or set it to "
            f"'tensorflow' (in the notebook, before HorovodRunner.run)."
        )


def tf_keras() -> ModuleType:
    """``tf.keras`` (Keras 2 or 3), after checking the backend."""
    check_backend()
    import tensorflow as tf

    keras: ModuleType = tf.keras
    return keras


def is_keras3() -> bool:
    """True when ``tf.keras`` is Keras 3."""
    return generation() == 3


def keras_version() -> str:
    """The version of the Keras that ``tf.keras`` is (``tf.keras`` itself may not say)."""
    return _version("tf_keras" if mode() == "tf_keras" else "keras") or "unknown"


def tf_variable(var: Any) -> Any:
    """The ``tf.Variable`` behind a Keras variable (Keras 3 wraps it in ``.value``)."""
    import tensorflow as tf

    if isinstance(var, tf.Variable):
        return var
    inner = getattr(var, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(f"not a TensorFlow-backed variable: {type(var).__name__} {var!r}")


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables (a property on Keras 3 and Keras 2.11+, a method on legacy)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer: Any, trainable_variables: Sequence[Any]) -> None:
    """Create the optimizer's slot variables now, so they can be restored and broadcast."""
    if getattr(optimizer, "built", False) or getattr(optimizer, "_built", False):
        return
    if hasattr(optimizer, "build"):
        optimizer.build(list(trainable_variables))
    elif hasattr(optimizer, "_create_all_weights"):  # legacy Keras 2 optimizers
        optimizer._create_all_weights(list(trainable_variables))


def set_learning_rate(optimizer: Any, value: float) -> None:
    lr = getattr(optimizer, "learning_rate", None)
    if lr is not None and hasattr(lr, "assign"):
        lr.assign(value)
    else:
        optimizer.learning_rate = value


# -- rank processes: the import guard -----------------------------------------------------
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
    - ``keras2``: nothing to do.
    """
    current = mode()
    if current == "keras3":
        already = [m for m in HOROVOD_KERAS_MODULES if m in sys.modules]
        if already:  # pragma: no cover - a rank starts from a fresh interpreter
            raise ImportError(KERAS3_HOROVOD_ERROR.format(module=already[0], tf="2.16+"))
        sys.meta_path.insert(0, _HorovodKerasBlocker(_version("tensorflow") or "?"))
    elif current == "tf_keras" and "keras" not in sys.modules:
        sys.meta_path.insert(0, _KerasToTfKeras())
    return current
