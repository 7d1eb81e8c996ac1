"""TensorFlow tensors into hvdrunner's engine and back, eager or inside ``tf.function``.

The engine speaks torch tensors (its transport is ``torch.distributed``). A TensorFlow tensor
reaches it through DLPack: the torch tensor shares the TensorFlow buffer (CPU or GPU), so the
step's hot path copies nothing on the way in, and the engine's result comes back the same way.
Eagerly the collective runs at once; in a graph (Keras' ``fit``, any ``tf.function``) it is one
``tf.py_function`` node, which TensorFlow orders with the graph's other stateful ops, so every
rank issues its collectives in program order. XLA cannot compile a Python call: a
``jit_compile=True`` function that reaches a collective fails with TensorFlow's own error.

Engine errors become TensorFlow's, as Horovod's kernels raise them: ranks that disagree
(shapes, types, ops, roots) ``FailedPreconditionError``; a bad argument
``InvalidArgumentError``; a lost peer or a shut-down engine ``UnknownError``
(``hvd.elastic.run`` recognises it).

Example:
    >>> import tensorflow as tf
    >>> run(lambda ts: [t * 2 for t in ts], [tf.constant([1.0])], "double")[0].numpy()
    array([2.], dtype=float32)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import torch
from torch.utils import dlpack as torch_dlpack

from hvdrunner._logging import get_logger
from hvdrunner.errors import HorovodInternalError

Engine = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]
ALIGNMENT = 64  # bytes: Eigen's EIGEN_MAX_ALIGN_BYTES in TensorFlow's CPU kernels
#: Types Horovod moves (allgather, broadcast, alltoall) that torch.distributed lacks: sent as
#: the signed type of the same width. Reductions refuse them (the engine sees int16).
_LAST: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
#: The engine's last lost-peer error: a graph's ``tf.py_function`` turns it into an
#: ``UnknownError`` like any other, so ``hvd.elastic.run`` asks here, not the message.
_LOST: list[BaseException] = []
BITS_AS = {tf.uint16: tf.int16, tf.uint32: tf.int32, tf.uint64: tf.int64}


def _not_converted(package: str) -> None:
    """AutoGraph rewrites the Python a ``tf.function`` calls unless told it is a library's:
    the engine's calls are plain Python (no tensor-dependent control flow), and rewritten
    they break (closures, keyword arguments). Horovod's own modules are skipped the same way."""
    try:
        from tensorflow.python.autograph.core import config

        rule = config.DoNotConvert(package)
        if all(getattr(r, "_prefix", None) != package for r in config.CONVERSION_RULES):
            config.CONVERSION_RULES = (rule, *config.CONVERSION_RULES)
    except (ImportError, AttributeError):  # a TensorFlow without the rule table: converted
        pass


_not_converted("hvdrunner.engine")


def to_torch(t: tf.Tensor) -> torch.Tensor:
    """The engine's view of an eager tensor: the same memory where DLPack allows."""
    if t.dtype in BITS_AS:  # moved, never reduced: the same bits in a type gloo carries
        t = tf.bitcast(t, BITS_AS[t.dtype])
    try:
        return torch.from_dlpack(tf.experimental.dlpack.to_dlpack(t))
    except (tf.errors.InvalidArgumentError, RuntimeError, TypeError, ValueError):
        return torch.from_numpy(np.array(t))  # a type DLPack lacks: one copy


def to_tf(t: torch.Tensor) -> tf.Tensor:
    """An engine result as an eager tensor (shared memory where DLPack allows)."""
    t = t.contiguous()
    if t.data_ptr() % ALIGNMENT:
        # A view into a fusion buffer: TensorFlow's kernels abort on a CPU buffer that is not
        # 64-byte aligned (Tensor::CheckTypeAndIsAligned), so it gets a buffer of its own.
        t = t.clone()
    try:
        return tf.experimental.dlpack.from_dlpack(torch_dlpack.to_dlpack(t))
    except (tf.errors.InvalidArgumentError, RuntimeError, TypeError, ValueError):
        return tf.convert_to_tensor(t.cpu().numpy())


def tf_error(exc: BaseException) -> BaseException:
    """The TensorFlow error Horovod's kernels raise for what the engine raised."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    message = str(exc)
    cause = exc.__cause__ if isinstance(exc, HorovodInternalError) else exc
    if isinstance(cause, HorovodInternalError):  # a peer lost, or the engine shut down
        _LOST[:] = [cause]
        return tf.errors.UnknownError(None, None, message)
    if isinstance(cause, RuntimeError):  # the ranks disagreed: every rank has this error
        return tf.errors.FailedPreconditionError(None, None, message)
    if isinstance(cause, ValueError | TypeError):
        return tf.errors.InvalidArgumentError(None, None, message)
    return exc


#: The variable name that carries a disagreement's message out of a graph (see _graph_call).
DISAGREED = "{} [hvdrunner: Horovod's FailedPreconditionError, carried out of the graph]"


def _log_disagreement(message: str) -> None:
    """The engine's words, on their own line of the log: in a graph TensorFlow wraps them."""
    get_logger().error("a collective failed: %s", message)


def peer_lost() -> BaseException | None:
    """The engine's error for a lost peer since the last :func:`forget_lost_peer` (or
    ``None``)."""
    return _LOST[0] if _LOST else None


def forget_lost_peer() -> None:
    """The job was re-formed (``hvd.elastic``'s reset): a new loss is a new error."""
    _LOST.clear()


def _call(engine: Engine, inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType] | None,
          in_graph: bool = False) -> list[tf.Tensor]:  # fmt: skip
    try:
        outs = [to_tf(o) for o in engine([to_torch(t) for t in inputs])]
    except (RuntimeError, ValueError, TypeError) as exc:
        error = tf_error(exc)
        if in_graph and isinstance(error, tf.errors.InvalidArgumentError):
            # tf.py_function reports a ValueError as InvalidArgumentError, and any other
            # exception (tf.errors' own included) as UnknownError with the message kept
            raise ValueError(str(exc)) from exc
        raise error from exc
    if dtypes is None:
        return outs
    return [tf.bitcast(o, d) if o.dtype != d else o for o, d in zip(outs, dtypes, strict=True)]


def _after_previous(graph: Any) -> list[Any]:
    """In a TensorFlow 1 graph, each collective waits for the one built before it: a
    ``py_function`` blocks one of the session's few threads while it waits for the other
    ranks, and ranks that start their collectives in different orders would wait on each
    other forever. ``tf.function`` orders stateful operations itself."""
    if getattr(graph, "building_function", False):
        return []
    last = _LAST.get(graph)
    return [] if last is None else [last]


def run(engine: Engine, inputs: Sequence[Any], what: str,
        outputs: Sequence[tuple[tf.DType, Any]] | None = None) -> list[tf.Tensor]:  # fmt: skip
    """``engine(torch tensors) -> torch tensors`` as a TensorFlow operation on ``inputs``.

    ``outputs``: each result's dtype and (possibly partial) shape in a graph; by default the
    inputs' own. Eagerly the call runs now; in a graph it is a ``tf.py_function`` named
    ``what``.
    """
    inputs = [tf.convert_to_tensor(t) for t in inputs]
    kinds = outputs if outputs is not None else [(t.dtype, t.shape) for t in inputs]
    dtypes = [d for d, _ in kinds]
    if tf.executing_eagerly():
        return _call(engine, inputs, dtypes)
    graph = tf.compat.v1.get_default_graph()
    in_function = bool(getattr(graph, "building_function", False))
    with tf.control_dependencies(_after_previous(graph)):
        got = tf.py_function(lambda *xs: _graph_call(engine, xs, dtypes), inputs,
                             [*dtypes, tf.resource, tf.bool], name=what)  # fmt: skip
    outs = _checked(list(got[:-2]), got[-2], got[-1], in_function)
    if not in_function:
        _LAST[graph] = outs[0].op
    for out, (_, shape) in zip(outs, kinds, strict=True):
        out.set_shape(shape)
    return outs


#: Read by every collective of a tf.function that succeeded (made once, eagerly).
_OK: list[tf.Variable] = []


def _graph_call(engine: Engine, inputs: Sequence[tf.Tensor],
                dtypes: Sequence[tf.DType]) -> list[tf.Tensor]:  # fmt: skip
    """:func:`_call` inside a graph: the results, then a variable handle and whether the
    ranks agreed. ``tf.py_function`` reports every Python error but ``ValueError`` as
    ``UnknownError``, so ranks that disagree hand back a handle to no variable, named with
    Horovod's message; reading it (:func:`_checked`) raises ``FailedPreconditionError``, the
    error Horovod's kernels raise, with that message."""
    try:
        outs = _call(engine, inputs, dtypes, in_graph=True)
    except tf.errors.FailedPreconditionError as exc:
        _log_disagreement(str(exc))
        missing = tf.raw_ops.VarHandleOp(
            dtype=tf.int32, shape=[], shared_name=DISAGREED.format(exc)
        )
        return [*(tf.zeros([0], d) for d in dtypes), missing, tf.constant(False)]
    if not _OK:
        _OK.append(tf.Variable(0, dtype=tf.int32, trainable=False))
    return [*outs, _OK[0].handle, tf.constant(True)]


def _checked(outs: list[tf.Tensor], handle: tf.Tensor, agreed: tf.Tensor,
             in_function: bool) -> list[tf.Tensor]:  # fmt: skip
    """The results, once the handle of :func:`_graph_call` was read. In a ``tf.function``
    the read runs every time (a handle to one variable of the eager context); a TensorFlow 1
    session has its own variables, so there only a disagreement reads it."""

    def after_read() -> list[tf.Tensor]:
        # An Assert on what was read: stateful, so no optimisation drops the read (a control
        # dependency on the read alone would be dropped, the read being stateless)
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32)
        with tf.control_dependencies([tf.raw_ops.Assert(condition=tf.equal(read, 0), data=[read])]):
            return [tf.identity(o) for o in outs]

    if in_function:
        return after_read()
    got = tf.cond(agreed, lambda: [tf.identity(o) for o in outs], after_read)
    return list(got) if isinstance(got, list | tuple) else [got]
