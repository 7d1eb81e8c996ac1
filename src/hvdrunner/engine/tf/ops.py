"""Horovod's TensorFlow operations (``horovod.tensorflow.mpi_ops``) on hvdrunner's engine.

Each operation is differentiable with Horovod's gradient (an allreduce's is the allreduce of
the gradient; an allgather's the averaged gradient's own rows; a broadcast's reaches the root
only; an alltoall's goes back the way it came; a reducescatter's is an allgather), runs eagerly
or inside ``tf.function`` (:mod:`hvdrunner.engine.tf.bridge`), and is named in a graph after its
input as Horovod names it, so every rank's graph asks for the same request.

Example:
    >>> import tensorflow as tf
    >>> init(); _allreduce(tf.constant([1.0, 2.0]), op=Sum).numpy()
    array([1., 2.], dtype=float32)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import torch

from hvdrunner.engine import ops as engine_ops
from hvdrunner.engine import state
from hvdrunner.engine.process_sets import ProcessSet, global_process_set
from hvdrunner.engine.requests import ADASUM, AVERAGE, MAX, MIN, PRODUCT, SUM
from hvdrunner.engine.tf import bridge

Average, Sum, Adasum, Min, Max, Product = AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT
synchronize = engine_ops.synchronize


def _normalize_name(name: str) -> str:
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _key(prefix: str, tensors: Sequence[Any], name: str | None,
         ignore_name_scope: bool) -> str | None:  # fmt: skip
    """The request's name: eagerly the caller's (or the engine's numbering); in a graph
    Horovod's ``Horovod<Op>_<input name>``, and a given name inside the current name scope."""
    if tf.executing_eagerly():
        return name
    if name is None:
        names = [tensors[0].name, tensors[-1].name] if len(tensors) > 1 else [tensors[0].name]
        return _normalize_name(f"{prefix}_{'_'.join(names)}")
    scope = tf.get_current_name_scope()
    return f"{scope}/{name}" if scope and not ignore_name_scope else name


def _op(op: int) -> int:
    if op == ADASUM:
        raise NotImplementedError(engine_ops.ADASUM_REFUSED)
    return engine_ops.reduction(op, None)


def _reducible(tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    """Horovod's refusal of a type it cannot reduce, here before any rank waits."""
    for t in tensors:
        if t.dtype in bridge.BITS_AS or t.dtype == tf.bool:
            raise tf.errors.InvalidArgumentError(
                None, None, f"Tensor type {t.dtype.name} is not supported in a reduction."
            )
    return tensors


def _filled(grads: Sequence[Any], like: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Upstream gradients in their outputs' types, zeros where an output was not used."""
    return [
        tf.zeros_like(o) if g is None else (g if g.dtype == o.dtype else tf.cast(g, o.dtype))
        for g, o in zip(grads, like, strict=True)
    ]


# -- allreduce ------------------------------------------------------------------------------
def _grouped_allreduce(tensors: Sequence[Any], name: str | None = None, op: int = Sum,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       ignore_name_scope: bool = False,
                       process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:  # fmt: skip
    """Reduce each tensor over the ranks (Sum by default), as one request."""
    tensors = _reducible([tf.convert_to_tensor(t) for t in tensors])
    op = _op(op)
    key = _key("HorovodGroupedAllreduce", tensors, name, ignore_name_scope)

    def engine(ts: list[torch.Tensor]) -> Any:
        return synchronize(engine_ops.grouped_allreduce_async(
            ts, name=key, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set))  # fmt: skip

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        outs = bridge.run(engine, xs, "HorovodGroupedAllreduce")

        def grad(*dys: Any) -> Any:
            return _grouped_allreduce(_filled(dys, outs), op=op, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor,
                                      ignore_name_scope=ignore_name_scope,
                                      process_set=process_set)  # fmt: skip

        return outs, grad

    return list(forward(*tensors))


def _allreduce(tensor: Any, name: str | None = None, op: int = Sum,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               ignore_name_scope: bool = False,
               process_set: ProcessSet = global_process_set) -> tf.Tensor:  # fmt: skip
    """``tensor`` reduced over the ranks (Sum by default)."""
    tensor = tf.convert_to_tensor(tensor)
    if name is None and not tf.executing_eagerly():
        name, ignore_name_scope = f"HorovodAllreduce_{_normalize_name(tensor.name)}", True
    return _grouped_allreduce([tensor], name, op, prescale_factor, postscale_factor,
                              ignore_name_scope, process_set)[0]  # fmt: skip


def allreduce_each(tensors: Sequence[Any], op: int = Average, prescale_factor: float = 1.0,
                   postscale_factor: float = 1.0,
                   process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:  # fmt: skip
    """One allreduce request per tensor (Horovod's ``groups=None``), all in flight together:
    the engine fuses them as they come, and an eager caller waits once, not per tensor. Not
    differentiable (gradients of gradients are not averaged)."""
    tensors = _reducible([tf.convert_to_tensor(t) for t in tensors])
    op = _op(op)
    names = [_key("HorovodAllreduce", [t], None, True) for t in tensors]

    def engine(ts: list[torch.Tensor]) -> Any:
        handles = [engine_ops.allreduce_async(t, name=n, op=op, prescale_factor=prescale_factor,
                                              postscale_factor=postscale_factor,
                                              process_set=process_set)
                   for t, n in zip(ts, names, strict=True)]  # fmt: skip
        return [synchronize(h) for h in handles]

    return bridge.run(engine, tensors, "HorovodAllreduceEach") if tensors else []


# -- allgather ------------------------------------------------------------------------------
def _my_rows(grad: tf.Tensor, dim0: Any, process_set: ProcessSet) -> tf.Tensor:
    """This rank's rows of an allgather's (averaged) gradient."""
    dims = allgather(tf.reshape(dim0, [1]), process_set=process_set)
    mine = state.resolve(process_set)[1].index(state.rank())
    start = tf.reduce_sum(dims[:mine])
    return grad[start : start + dims[mine]]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:  # fmt: skip
    """Every rank's tensors concatenated along the first dimension (which may differ)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    key = _key("HorovodGroupedAllgather", tensors, name, ignore_name_scope)
    kinds = [(t.dtype, tf.TensorShape([None]).concatenate(t.shape[1:])) for t in tensors]

    def engine(ts: list[torch.Tensor]) -> Any:
        return synchronize(
            engine_ops.grouped_allgather_async(ts, name=key, process_set=process_set)
        )

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        outs = bridge.run(engine, xs, "HorovodGroupedAllgather", kinds)

        def grad(*dys: Any) -> Any:
            avg = _grouped_allreduce(_filled(dys, outs), op=Average, process_set=process_set)
            return [_my_rows(g, tf.shape(x)[0], process_set) for g, x in zip(avg, xs, strict=True)]

        return outs, grad

    return list(forward(*tensors))


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:  # fmt: skip
    """Every rank's ``tensor`` concatenated along the first dimension."""
    tensor = tf.convert_to_tensor(tensor)
    if name is None and not tf.executing_eagerly():
        name, ignore_name_scope = f"HorovodAllgather_{_normalize_name(tensor.name)}", True
    return grouped_allgather([tensor], name, ignore_name_scope, process_set)[0]


# -- broadcast ------------------------------------------------------------------------------
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:  # fmt: skip
    """``root_rank``'s ``tensor`` on every rank of the set."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HorovodBroadcast", [tensor], name, ignore_name_scope)

    def engine(ts: list[torch.Tensor]) -> Any:
        return [
            synchronize(
                engine_ops.broadcast_async(ts[0], root_rank, name=key, process_set=process_set)
            )
        ]

    @tf.custom_gradient
    def forward(x: tf.Tensor) -> Any:
        out = bridge.run(engine, [x], "HorovodBroadcast")[0]

        def grad(dy: Any) -> Any:
            avg = _allreduce(_filled([dy], [out])[0], op=Average, process_set=process_set)
            return avg if state.rank() == root_rank else avg * 0

        return out, grad

    return forward(tensor)


def broadcast_group(tensors: Sequence[Any], root_rank: int, names: Sequence[str | None],
                    process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:  # fmt: skip
    """``root_rank``'s tensors on every rank: one broadcast request per tensor, all in
    flight together (one operation in a graph)."""

    def engine(ts: list[torch.Tensor]) -> Any:
        handles = [engine_ops.broadcast_async(t, root_rank, name=n, process_set=process_set)
                   for t, n in zip(ts, names, strict=True)]  # fmt: skip
        return [synchronize(h) for h in handles]

    return bridge.run(engine, tensors, "HorovodBroadcastGroup") if tensors else []


def broadcast_(variables: Sequence[Any], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:  # fmt: skip
    """Overwrite ``variables`` (``tf.Variable`` or Keras 3 variables) with ``root_rank``'s
    values, in place; their new values."""
    variables = list(variables)
    eager = tf.executing_eagerly()
    base = name or "HorovodBroadcastInplace"
    names = [None if eager and name is None else
             f"{base}_{i}_{_normalize_name(str(getattr(v, 'path', None) or v.name))}"
             for i, v in enumerate(variables)]  # fmt: skip
    values = broadcast_group([tf.convert_to_tensor(v) for v in variables], root_rank, names,
                             process_set)  # fmt: skip
    assigns = [v.assign(x) for v, x in zip(variables, values, strict=True)]
    with tf.control_dependencies([a for a in assigns if a is not None] if not eager else []):
        return [tf.identity(x) for x in values]


# -- alltoall -------------------------------------------------------------------------------
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:  # fmt: skip
    """Rows ``splits[i]`` of ``tensor`` to rank ``i`` (equal shares without ``splits``); the
    rows every rank sent here, and, when ``splits`` is given, how many came from each."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HorovodAlltoall", [tensor], name, ignore_name_scope)
    given = splits is not None
    inputs = [tensor, tf.convert_to_tensor(splits) if given else tf.constant([], tf.int32)]
    kinds = [(tensor.dtype, tf.TensorShape([None]).concatenate(tensor.shape[1:])),
             (tf.int32, tf.TensorShape([None]))]  # fmt: skip

    def engine(ts: list[torch.Tensor]) -> Any:
        counts = ts[1].to(torch.int64) if given else None
        if counts is not None and counts.dim() != 1:
            raise ValueError("alltoall splits must be a 1-D tensor of integers")
        out, received = synchronize(
            engine_ops.alltoall_async(ts[0], counts, name=key, process_set=process_set)
        )
        return [out, torch.as_tensor(received).to(torch.int32)]

    @tf.custom_gradient
    def forward(x: tf.Tensor, s: tf.Tensor) -> Any:
        out, received = bridge.run(engine, [x, s], "HorovodAlltoall", kinds)

        def grad(dy: Any, _dead: Any = None) -> Any:
            back = alltoall(_filled([dy], [out])[0], splits=received, process_set=process_set)
            return back[0], None

        return (out, received), grad

    out, received = forward(*inputs)
    return (out, received) if given else out


# -- reducescatter --------------------------------------------------------------------------
def _grouped_reducescatter(tensors: Sequence[Any], name: str | None = None, op: int = Sum,
                           ignore_name_scope: bool = False,
                           process_set: ProcessSet = global_process_set,
                           prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0) -> list[tf.Tensor]:  # fmt: skip
    """Reduce each tensor over the ranks; each rank keeps its share of the first dimension
    (the first ``rows % n`` ranks one row more)."""
    tensors = _reducible([tf.convert_to_tensor(t) for t in tensors])
    key = _key("HorovodGroupedReducescatter", tensors, name, ignore_name_scope)
    kinds = [(t.dtype, tf.TensorShape([None]).concatenate(t.shape[1:])) for t in tensors]

    def engine(ts: list[torch.Tensor]) -> Any:
        return synchronize(engine_ops.grouped_reducescatter_async(
            ts, name=key, op=op, process_set=process_set, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor))  # fmt: skip

    n = len(state.resolve(process_set)[1])
    factor = prescale_factor * postscale_factor * (n if op == Sum else 1)

    @tf.custom_gradient
    def forward(*xs: tf.Tensor) -> Any:
        outs = bridge.run(engine, xs, "HorovodGroupedReducescatter", kinds)

        def grad(*dys: Any) -> Any:
            scaled = [g * tf.cast(factor, g.dtype) if factor != 1.0 else g
                      for g in _filled(dys, outs)]  # fmt: skip
            return grouped_allgather(scaled, process_set=process_set)

        return outs, grad

    return list(forward(*tensors))


def _reducescatter(tensor: Any, name: str | None = None, op: int = Sum,
                   ignore_name_scope: bool = False,
                   process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                   postscale_factor: float = 1.0) -> tf.Tensor:  # fmt: skip
    tensor = tf.convert_to_tensor(tensor)
    if name is None and not tf.executing_eagerly():
        name, ignore_name_scope = f"HorovodReducescatter_{_normalize_name(tensor.name)}", True
    return _grouped_reducescatter([tensor], name, op, ignore_name_scope, process_set,
                                  prescale_factor, postscale_factor)[0]  # fmt: skip


# -- join, barrier, and the basics as operations ----------------------------------------------
def join() -> tf.Tensor:
    """This rank has no more batches: serve the others' allreduces with zeros until every rank
    joined. Returns the rank that joined last (the same on every rank)."""

    def engine(_: list[torch.Tensor]) -> Any:
        return [torch.tensor(engine_ops.join(), dtype=torch.int32)]

    return bridge.run(engine, [tf.constant(0)], "HorovodJoin", [(tf.int32, tf.TensorShape([]))])[0]


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the set got here."""
    engine_ops.barrier(process_set)


def _int_op(value: Any, name: str | None) -> tf.Tensor:
    with tf.name_scope(name or "Horovod"):
        return tf.constant(value, dtype=tf.int32)


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    return _int_op(len(state.current().sets[process_set_id].ranks), name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    return _int_op(state.local_size(), name)


def rank_op(name: str | None = None) -> tf.Tensor:
    return _int_op(state.rank(), name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return _int_op(state.local_rank(), name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    return _int_op(int(state.rank() in state.current().sets[process_set_id].ranks), name)
