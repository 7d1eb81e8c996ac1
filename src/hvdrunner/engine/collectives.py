"""Horovod's synchronous collectives, differentiable as Horovod's are (each is an autograd
function whose backward is the matching collective of the gradient).

Example:
    >>> from hvdrunner.engine import state
    >>> import torch
    >>> state.init()
    >>> allgather(torch.ones(2, 1)).shape
    torch.Size([2, 1])
    >>> state.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hvdrunner.engine import ops, state
from hvdrunner.engine.compression import Compression, Compressor
from hvdrunner.engine.ops import AVERAGE, SUM, synchronize
from hvdrunner.engine.process_sets import ProcessSet, global_process_set


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: int, pre: float,
                post: float, process_set: ProcessSet) -> torch.Tensor:  # fmt: skip
        ctx.args = (op, pre, post, process_set)
        return synchronize(ops.grouped_allreduce_async_impl([tensor], None, name, op, pre, post,
                                                            process_set))[0]  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, pre, post, ps = ctx.args
        out = synchronize(ops.grouped_allreduce_async_impl([grad.contiguous()], None, None, op,
                                                           pre, post, ps))[0]  # fmt: skip
        return out, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # fmt: skip
    """``tensor`` averaged (``op=Average``, the default), summed, or its minimum, maximum or
    product over the ranks; a new tensor. Differentiable."""
    op = ops.reduction(op, average)
    sent, ctx = compression.compress(tensor)
    out = _Allreduce.apply(sent, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:  # fmt: skip
    """As :func:`allreduce`, in place."""
    return synchronize(ops.allreduce_async_(tensor, average, name, op, prescale_factor,
                                            postscale_factor, process_set))  # fmt: skip


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: int, pre: float, post: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> Any:  # fmt: skip
        ctx.args = (op, pre, post, process_set)
        return tuple(synchronize(ops.grouped_allreduce_async_impl(list(tensors), None, name, op,
                                                                  pre, post, process_set)))  # fmt: skip

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, pre, post, ps = ctx.args
        outs = synchronize(ops.grouped_allreduce_async_impl([g.contiguous() for g in grads], None,
                                                            None, op, pre, post, ps))  # fmt: skip
        return (None, None, None, None, None, *outs)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: type[Compressor] = Compression.none,
                      op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:  # fmt: skip
    """:func:`allreduce` of several tensors as one request."""
    op = ops.reduction(op, average)
    sent, ctxs = zip(*[compression.compress(t) for t in tensors], strict=False)
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set, *sent)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs, strict=False)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: int | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:  # fmt: skip
    return synchronize(ops.grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                    postscale_factor, process_set))  # fmt: skip


def _offset_of_mine(dim0: int, process_set: ProcessSet) -> int:
    """Where this rank's rows start in an allgather's result (the ranks' first dims)."""
    _, ranks = state.resolve(process_set)
    dims = synchronize(ops.allgather_async(torch.tensor([dim0], dtype=torch.int64),
                                           process_set=process_set))  # fmt: skip
    return int(dims[: ranks.index(state.rank())].sum())


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, ps: ProcessSet) -> torch.Tensor:
        ctx.dim0, ctx.ps = tensor.shape[0], ps
        return synchronize(ops.allgather_async(tensor, name, ps))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), op=AVERAGE, process_set=ctx.ps)
        start = _offset_of_mine(ctx.dim0, ctx.ps)
        return reduced.narrow(0, start, ctx.dim0), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # fmt: skip
    """Every rank's ``tensor`` concatenated along the first dimension (which may differ
    between ranks). Differentiable."""
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, ps: ProcessSet, *tensors: torch.Tensor) -> Any:
        ctx.dims, ctx.ps = [t.shape[0] for t in tensors], ps
        return tuple(synchronize(ops.grouped_allgather_async(list(tensors), name, ps)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=AVERAGE, process_set=ctx.ps)
        outs = [
            r.narrow(0, _offset_of_mine(d, ctx.ps), d)
            for r, d in zip(reduced, ctx.dims, strict=False)
        ]
        return (None, None, *outs)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:  # fmt: skip
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root: int, name: str | None,
                ps: ProcessSet) -> torch.Tensor:  # fmt: skip
        ctx.root, ctx.ps = root, ps
        return synchronize(ops.broadcast_async(tensor, root, name, ps))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), op=AVERAGE, process_set=ctx.ps)
        if state.rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # fmt: skip
    """``root_rank``'s ``tensor`` on every rank; a new tensor. Differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:  # fmt: skip
    """As :func:`broadcast`, into ``tensor``."""
    return synchronize(ops.broadcast_async_(tensor, root_rank, name, process_set))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                ps: ProcessSet) -> Any:  # fmt: skip
        output, received = synchronize(ops.alltoall_async(tensor, splits, name, ps))
        ctx.received, ctx.ps = received, ps
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *dead: Any) -> Any:
        back, _ = synchronize(ops.alltoall_async(grad.contiguous(), ctx.received, None, ctx.ps))
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:  # fmt: skip
    """Rows ``splits[i]`` of ``tensor`` go to rank ``i``; the rows every rank sent here, and
    (when ``splits`` is given) how many came from each. Differentiable."""
    return _Alltoall.apply(tensor, splits, name, process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: int, ps: ProcessSet,
                pre: float, post: float) -> torch.Tensor:  # fmt: skip
        ctx.args = (op, ps, pre, post)
        return synchronize(ops.reducescatter_async(tensor, name, op, ps, pre, post))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, ps, pre, post = ctx.args
        # Horovod's gradient: Sum's scales by the set's size, Average's by nothing
        factor = pre * post * (len(state.resolve(ps)[1]) if op == SUM else 1)
        out = allgather((grad * factor if factor != 1.0 else grad).contiguous(), process_set=ps)
        return out, None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none, op: int = AVERAGE,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:  # fmt: skip
    """``tensor`` reduced over the ranks, each keeping its share of the first dimension.
    Differentiable."""
    sent, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(sent, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: int, ps: ProcessSet, pre: float, post: float,
                *tensors: torch.Tensor) -> Any:  # fmt: skip
        ctx.args = (op, ps, pre, post)
        return tuple(synchronize(ops.grouped_reducescatter_async(list(tensors), name, op, ps,
                                                                 pre, post)))  # fmt: skip

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, ps, pre, post = ctx.args
        factor = pre * post * (len(state.resolve(ps)[1]) if op == SUM else 1)
        outs = grouped_allgather([(g * factor).contiguous() for g in grads], process_set=ps)
        return (None, None, None, None, None, *outs)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = AVERAGE,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:  # fmt: skip
    sent, ctxs = zip(*[compression.compress(t) for t in tensors], strict=False)
    outs = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                       *sent)  # fmt: skip
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs, strict=False)]
