"""Which Keras is ``tf.keras`` here, and the few places where Keras 2 and Keras 3 differ.

Two generations are supported:

- **Keras 2**: TensorFlow <= 2.15 (``tf.keras`` is the ``keras`` 2.x package), or TensorFlow
  >= 2.16 with ``TF_USE_LEGACY_KERAS=1`` and ``tf_keras`` installed ("tf_keras mode").
- **Keras 3**: TensorFlow >= 2.16 by default, on the TensorFlow or the PyTorch backend
  (:mod:`hvdrunner.keras.backend`; JAX is refused: Horovod has no JAX collectives).

Horovod's own Keras layer (``horovod.tensorflow.keras``, ``horovod._keras``) trains
*unsynchronized without an error* under Keras 3. hvdrunner never imports it; inside a rank,
:func:`install_import_guard` makes importing it fail fast with the fix, and in tf_keras
mode it steers ``import keras`` to ``tf_keras`` so that Horovod's Keras layer works unchanged.
The version probing and the guard live in TF-free leaves (:mod:`hvdrunner._versions`,
:mod:`hvdrunner._import_guard`) so that a rank loads no Keras before user code; they are
re-exported here, as are the optimizer helpers the engine shares
(:mod:`hvdrunner._keras_optimizers`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hvdrunner import _versions
from hvdrunner._import_guard import (
    HOROVOD_KERAS_MODULES,
    KERAS3_HOROVOD_ERROR,
    install_import_guard,
)
from hvdrunner._keras_optimizers import build_optimizer, optimizer_variables
from hvdrunner._versions import LEGACY_ENV, generation, legacy_requested
from hvdrunner.keras import backend

__all__ = [
    "HOROVOD_KERAS_MODULES",
    "KERAS3_HOROVOD_ERROR",
    "LEGACY_ENV",
    "build_optimizer",
    "check_backend",
    "generation",
    "install_import_guard",
    "is_keras3",
    "keras_version",
    "legacy_requested",
    "keras_module",
    "mode",
    "optimizer_variables",
    "set_learning_rate",
]


def mode() -> str:
    """``"keras2"`` (TF <= 2.15), ``"tf_keras"`` (legacy mode on TF >= 2.16) or ``"keras3"``."""
    current = _versions.mode()
    return "keras2" if current == "none" else current


def check_backend() -> None:
    """Refuse a Keras backend hvdrunner cannot train on (JAX, or one not installed), with the fix."""
    backend.check()


def keras_module() -> ModuleType:
    """The Keras that trains here (``tf.keras``, or ``keras`` on PyTorch), backend checked."""
    return backend.keras_module()


def is_keras3() -> bool:
    """True when ``tf.keras`` is Keras 3."""
    return generation() == 3


def keras_version() -> str:
    """The version of the Keras that trains (``tf.keras`` itself may not say)."""
    return _versions.version("tf_keras" if mode() == "tf_keras" else "keras") or "unknown"


def set_learning_rate(optimizer: Any, value: float) -> None:
    lr = getattr(optimizer, "learning_rate", None)
    if lr is not None and hasattr(lr, "assign"):
        lr.assign(value)
    else:
        optimizer.learning_rate = value
