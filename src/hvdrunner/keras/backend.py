"""Which backend Keras trains on here, and Horovod's collectives for it.

- **TensorFlow** (Keras 2, and Keras 3 with ``KERAS_BACKEND=tensorflow``, Keras' default):
  Horovod's TensorFlow API on hvdrunner's engine (``hvdrunner.engine.tf``; a compiled
  ``horovod.tensorflow`` with ``HVDRUNNER_ENGINE=horovod``); nothing compiled.
- **PyTorch** (Keras 3 with ``KERAS_BACKEND=torch``): hvdrunner's engine (or ``horovod.torch``
  with ``HVDRUNNER_ENGINE=horovod``); nothing compiled, and TensorFlow need not
  be installed. The runtimes dropping TensorFlow (Databricks ML 18+) keep this path.
- **JAX**: refused with the reason (Horovod has no JAX collectives) and what to use instead.

The backend is Keras' own choice (``keras.config.backend()``), read once per process; before
Keras is imported (the driver's preflight) :func:`hvdrunner._versions.keras_backend` reads it
the way Keras will. Everything framework-specific in :mod:`hvdrunner.keras` goes through this
module: the Horovod module, the Keras module, variables' tensors and the array collectives.

Example:
    >>> check({"KERAS_BACKEND": "jax"})  # doctest: +SKIP
    Traceback (most recent call last):
    RuntimeError: KERAS_BACKEND='jax': Horovod has no JAX collectives ...
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from hvdrunner import _versions

TENSORFLOW, TORCH = "tensorflow", "torch"
SUPPORTED = (TENSORFLOW, TORCH)

JAX_ERROR = (
    "KERAS_BACKEND='jax': Horovod has no JAX collectives, so hvdrunner cannot average a JAX "
    "model's gradients over ranks. Set KERAS_BACKEND=torch (or tensorflow) for Keras with "
    "HorovodRunner - the same Keras code runs unchanged - or train JAX with jax.distributed "
    "outside Horovod."
)


def check(env: dict[str, str] | None = None) -> str:
    """The backend Keras will use, if hvdrunner can train on it; ``RuntimeError`` naming the
    fix otherwise. Imports nothing heavy (safe on the driver, before any rank starts)."""
    backend = _versions.keras_backend(env)
    if backend == "jax":
        raise RuntimeError(JAX_ERROR)
    if backend not in SUPPORTED:
        raise RuntimeError(
            f"KERAS_BACKEND={backend!r}: hvdrunner trains Keras on 'tensorflow' or 'torch' "
            f"(Horovod's collectives exist for those). Set KERAS_BACKEND to one of them."
        )
    needs = "tensorflow" if backend == TENSORFLOW else "torch"
    installed = _versions.tensorflow() if backend == TENSORFLOW else _versions.version("torch")
    if installed is None:
        other = TORCH if backend == TENSORFLOW else TENSORFLOW
        default = " (Keras' default when KERAS_BACKEND is unset)" if backend == TENSORFLOW else ""
        raise RuntimeError(
            f"Keras' backend is {backend!r}{default} but {needs} is not installed here. Set "
            f"KERAS_BACKEND={other} (os.environ['KERAS_BACKEND'] = '{other}' in the notebook "
            f"before HorovodRunner.run and before importing keras; HorovodRunner passes it to "
            f"the ranks), or install {needs}."
        )
    return backend


@functools.cache
def name() -> str:
    """``"tensorflow"`` or ``"torch"``: the backend Keras runs on in this process (Keras'
    own answer; ``RuntimeError`` for one hvdrunner cannot train on)."""
    check()
    if _versions.generation() == 2:
        return TENSORFLOW  # Keras 2 (tf.keras or tf_keras) has no other backend
    import keras

    backend = str(keras.config.backend())
    if backend not in SUPPORTED:  # Keras read a backend the preflight did not see
        check({"KERAS_BACKEND": backend})
    return backend


def is_torch() -> bool:
    return name() == TORCH


def horovod() -> ModuleType:
    """Horovod's PyTorch or TensorFlow API, matching Keras' backend: hvdrunner's engine, or
    the compiled ``horovod.torch``/``horovod.tensorflow`` (``HVDRUNNER_ENGINE=horovod``)."""
    # hvdrunner's engine unless HVDRUNNER_ENGINE=horovod
    if is_torch():
        return importlib.import_module(_versions.torch_engine())
    module = importlib.import_module(_versions.tf_engine())
    # Unchanged Horovod Keras code (tf_keras mode) initialises the compiled horovod itself:
    # hvdrunner's helpers then use the Horovod the rank's code initialised.
    compiled = sys.modules.get("horovod.tensorflow")
    if compiled is None or compiled is module or module.is_initialized():
        return module
    return compiled if compiled.is_initialized() else module


def init(*args: Any, **kwargs: Any) -> None:
    """``hvd.init()`` of this backend's Horovod; and of the compiled ``horovod.tensorflow`` too
    where the rank's code imported it beside the engine (a callback or a helper calling
    ``horovod.tensorflow`` directly, as Horovod Keras code often does): it keeps working
    instead of failing with "Horovod has not been initialized"."""
    hvd = horovod()
    hvd.init(*args, **kwargs)
    compiled = sys.modules.get("horovod.tensorflow")
    if compiled is None or compiled is hvd or is_torch():
        return
    if not compiled.is_initialized():
        compiled.init()


def keras_module() -> ModuleType:
    """The Keras that trains here: ``tf.keras`` (Keras 2 or 3) on TensorFlow, ``keras`` on
    PyTorch."""
    if is_torch():
        import keras
    else:
        import tensorflow as tf

        keras = tf.keras
    return keras


def compression(spec: str | Any) -> Any:
    """Horovod's ``Compression.none``/``fp16`` of this backend, from a name or itself."""
    kinds = horovod().Compression
    if spec is None or spec == "none":
        return kinds.none
    if spec == "fp16":
        return kinds.fp16
    if spec in (kinds.none, kinds.fp16):
        return spec
    raise ValueError(
        f"compression must be 'none' or 'fp16' (or horovod's Compression.none/fp16), got {spec!r}"
    )


def tensor_of(var: Any) -> Any:
    """The framework tensor behind a Keras variable (``tf.Variable`` or torch ``Parameter``);
    its ``id`` identifies the variable across Keras 2 and 3."""
    if is_torch():
        return var.value
    import tensorflow as tf

    if isinstance(var, tf.Variable):
        return var
    inner = getattr(var, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(f"not a TensorFlow-backed variable: {type(var).__name__} {var!r}")


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Overwrite ``variables`` (Keras variables) on every rank with ``root_rank``'s values."""
    hvd = horovod()
    if not variables or hvd.size() == 1:
        return
    tensors = [tensor_of(v) for v in variables]
    if not is_torch():
        hvd.broadcast_variables(tensors, root_rank=root_rank)
        return
    import torch

    with torch.no_grad():  # in place, into the parameters Keras trains
        handles = [
            hvd.broadcast_async_(t, root_rank, name=f"hvdrunner.keras.var.{i}")
            for i, t in enumerate(tensors)
        ]
        for handle in handles:
            hvd.synchronize(handle)


def _tensor(values: Any) -> Any:
    """A number or array as this backend's tensor, for Horovod's framework ops."""
    if is_torch():
        import torch

        return torch.as_tensor(np.asarray(values))
    import tensorflow as tf

    return tf.constant(values)


def allreduce_array(
    values: Any, average: bool = True, name: str | None = None, op: Any = None
) -> np.ndarray:
    """A number or array averaged (or summed, or ``op``: Horovod's Min, Max, ...) over
    ranks, as numpy (a collective)."""
    hvd = horovod()
    if op is None:
        op = hvd.Average if average else hvd.Sum
    return np.asarray(hvd.allreduce(_tensor(values), op=op, name=name).numpy())


def broadcast_array(values: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    """``root_rank``'s number or array on every rank, as numpy (a collective)."""
    return np.asarray(horovod().broadcast(_tensor(values), root_rank, name=name).numpy())


def allgather_array(values: Any, name: str | None = None) -> np.ndarray:
    """Every rank's array concatenated along the first axis, as numpy (a collective)."""
    return np.asarray(horovod().allgather(_tensor(values), name=name).numpy())


__all__ = [
    "JAX_ERROR",
    "SUPPORTED",
    "allgather_array",
    "allreduce_array",
    "broadcast_array",
    "broadcast_variables",
    "check",
    "compression",
    "horovod",
    "init",
    "is_torch",
    "keras_module",
    "name",
    "tensor_of",
]
