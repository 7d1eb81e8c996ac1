"""Horovod's TensorFlow collectives as users call them (``hvd.allreduce``,
``hvd.grouped_allreduce``, ``hvd.reducescatter``...): the deprecated ``average`` argument,
``Compression``, and ``tf.IndexedSlices`` (an embedding's gradient: its rows and indices
gathered from every rank, as Horovod does), over :mod:`hvdrunner.engine.tf.ops`.

Example:
    >>> import tensorflow as tf
    >>> ops.init(); allreduce(tf.constant([2.0])).numpy()  # the average over ranks
    array([2.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hvdrunner.engine import ops as engine_ops
from hvdrunner.engine import state
from hvdrunner.engine.process_sets import ProcessSet, global_process_set
from hvdrunner.engine.tf import ops
from hvdrunner.engine.tf.compression import Compression

SPARSE_OPS = "Only Sum and Average ops are supported with tf.IndexedSlices"
SPARSE_ADASUM = (
    "The Adasum reduction does not currently support sparse tensors. As a workaround please "
    "pass sparse_as_dense=True to DistributedOptimizer"
)
SPARSE_SCALE = "Pre/postscale_factor are not supported with tf.IndexedSlices"


def _reduction(op: int | None, average: bool | None) -> int:
    if op == ops.Adasum and average is None:
        return op
    return engine_ops.reduction(op, average)


def _sparse(tensor: tf.IndexedSlices, op: int, pre: float, post: float,
            process_set: ProcessSet, ignore_name_scope: bool) -> tf.IndexedSlices:  # fmt: skip
    if op == ops.Adasum:
        raise NotImplementedError(SPARSE_ADASUM)
    if op not in (ops.Sum, ops.Average):
        raise NotImplementedError(SPARSE_OPS)
    if pre != 1.0 or post != 1.0:
        raise NotImplementedError(SPARSE_SCALE)
    values = ops.allgather(tensor.values, process_set=process_set,
                           ignore_name_scope=ignore_name_scope)  # fmt: skip
    indices = ops.allgather(tensor.indices, process_set=process_set,
                            ignore_name_scope=ignore_name_scope)  # fmt: skip
    if op == ops.Average:
        n = len(state.resolve(process_set)[1])
        values = values / tf.cast(n, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: Any = Compression.none,
              op: int | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> Any:  # fmt: skip
    """``tensor`` (a ``tf.Tensor`` or ``tf.IndexedSlices``) averaged over the ranks (or
    ``op``: ``hvd.Sum``, ``Min``, ``Max``, ``Product``).

    Example:
        >>> allreduce(tf.constant([1, 2]), op=ops.Sum).numpy()  # doctest: +SKIP
        array([2, 4], dtype=int32)
    """
    op = _reduction(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse(tensor, op, prescale_factor, postscale_factor, process_set,
                       ignore_name_scope)  # fmt: skip
    sent, ctx = compression.compress(tf.convert_to_tensor(tensor))
    reduced = ops._allreduce(sent, name=name, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor,
                             ignore_name_scope=ignore_name_scope, process_set=process_set)  # fmt: skip
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Any = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:  # fmt: skip
    """Each tensor averaged (or ``op``) over the ranks, the dense ones as one request;
    ``tf.IndexedSlices`` each gathered as :func:`allreduce` does."""
    if not tensors:
        return []
    op = _reduction(op, average)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out: list[Any] = [
        _sparse(t, op, prescale_factor, postscale_factor, process_set, ignore_name_scope)
        if isinstance(t, tf.IndexedSlices) else None
        for t in tensors
    ]  # fmt: skip
    if dense:
        sent, ctxs = zip(*[compression.compress(tf.convert_to_tensor(tensors[i]))
                           for i in dense], strict=True)  # fmt: skip
        reduced = ops._grouped_allreduce(list(sent), name=name, op=op,
                                         prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor,
                                         ignore_name_scope=ignore_name_scope,
                                         process_set=process_set)  # fmt: skip
        for i, r, c in zip(dense, reduced, ctxs, strict=True):
            out[i] = compression.decompress(r, c)
    return out


def _scatter_op(op: int) -> int:
    if op not in (ops.Average, ops.Sum):
        raise NotImplementedError(
            f"reducescatter takes op=hvd.Average or hvd.Sum, not {engine_ops.OP_NAMES.get(op, op)}"
        )
    return op


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,
                  op: int = ops.Average, name: str | None = None,
                  process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:  # fmt: skip
    """``tensor`` reduced over the ranks; each rank keeps its share of the first dimension."""
    op = _scatter_op(op)
    sent, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = ops._reducescatter(sent, name=name, op=op, ignore_name_scope=ignore_name_scope,
                             process_set=process_set, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor)  # fmt: skip
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Any = Compression.none, op: int = ops.Average,
                          process_set: ProcessSet = global_process_set,
                          ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0,
                          name: str | None = None) -> list[tf.Tensor]:  # fmt: skip
    op = _scatter_op(op)
    sent, ctxs = zip(*[compression.compress(tf.convert_to_tensor(t)) for t in tensors],
                     strict=True)  # fmt: skip
    outs = ops._grouped_reducescatter(list(sent), name=name, op=op,
                                      ignore_name_scope=ignore_name_scope,
                                      process_set=process_set,
                                      prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor)  # fmt: skip
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs, strict=True)]
