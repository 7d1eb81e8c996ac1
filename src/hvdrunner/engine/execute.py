"""Runs the requests every rank agreed on, on the data process groups.

Each rank runs the same ready requests in the same order (the negotiator's table is the same
everywhere), so the data groups see the same sequence of collectives on every rank. Consecutive
allreduces with the same dtype, device, reduction and scale factors go out as one flat buffer
(Horovod's tensor fusion), up to ``HOROVOD_FUSION_THRESHOLD`` bytes. A rank that joined takes
part in allreduces with zeros of the agreed shapes.

Horovod's arithmetic, kept so that results match it bit for bit: ``Average`` is a sum times
``postscale / size``; scale factors multiply in the tensor's type (float16 on the CPU through
float32; integers through float64, truncated), before and after any reduction (Min, Max and
Product too, as Horovod scales its fusion buffer whatever the op).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hvdrunner.engine import timeline
from hvdrunner.engine.requests import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    AVERAGE,
    BARRIER,
    BROADCAST,
    MAX,
    MIN,
    PROCESS_SET,
    PRODUCT,
    REDUCESCATTER,
    SUM,
    Ready,
    dtypes,
    inline,
    nbytes,
    result_factor,
)  # fmt: skip
from hvdrunner.errors import HorovodInternalError

_REDUCE = {SUM: dist.ReduceOp.SUM, AVERAGE: dist.ReduceOp.SUM, MIN: dist.ReduceOp.MIN,
           MAX: dist.ReduceOp.MAX, PRODUCT: dist.ReduceOp.PRODUCT}  # fmt: skip
#: A process set's data group and its ranks (global ranks, ascending), by id.
GroupOf = Callable[[int], tuple[Any, tuple[int, ...]]]


def scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t * factor`` as Horovod scales buffers (see the module docstring)."""
    if factor == 1.0:
        return t
    if not t.is_floating_point():
        return torch.trunc(t.to(torch.float64) * factor).to(t.dtype)
    if t.dtype in (torch.float16, torch.bfloat16) and t.device.type == "cpu":
        return (t.to(torch.float32) * factor).to(t.dtype)
    return t * factor


def wire(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a type the transport carries: gloo has no int16, which travels as int32 (sums
    and products wrap the same way modulo 2**16 once cast back)."""
    if t.dtype == torch.int16 and t.device.type == "cpu":
        return t.to(torch.int32)
    return t


class Executor:
    """Runs batches of ready requests for this rank (``rank``) over ``group_of``'s groups."""

    def __init__(self, rank: int, group_of: GroupOf, fusion_bytes: int) -> None:
        self.rank = rank
        self._group_of = group_of
        self._fusion = fusion_bytes

    def __call__(self, batch: list[Ready], joined: frozenset[int]) -> None:
        i = 0
        while i < len(batch):
            ready = batch[i]
            if ready.error is not None or self.rank not in ready.members:
                self._skip(ready)
                i += 1
                continue
            if ready.entry.kind == ALLREDUCE and inline(ready.entry.signatures[_any(ready)]):
                self._guarded([ready], lambda rs: self._inline(rs[0]))
                i += 1
                continue
            if ready.entry.kind == ALLREDUCE:
                j = self._fusable_run(batch, i)
                self._guarded(batch[i:j], lambda rs: self._allreduce(rs))
                i = j
                continue
            self._guarded([ready], lambda rs: self._single(rs[0]))
            i += 1

    def _skip(self, ready: Ready) -> None:
        if ready.error is not None and ready.mine is not None:
            ready.mine.handle.fail(RuntimeError(ready.error))

    def _guarded(self, readies: list[Ready], run: Callable[[list[Ready]], None]) -> None:
        try:
            with timeline.activity(readies):
                run(readies)
        except (ValueError, TypeError) as exc:  # a local problem: fail these requests only
            for ready in readies:
                if ready.mine is not None:
                    ready.mine.handle.fail(exc)
        except BaseException as exc:  # the transport: these fail, then the whole engine
            for ready in readies:
                if ready.mine is not None:
                    ready.mine.handle.fail(
                        HorovodInternalError(f"{ready.entry.kind} {ready.key[1]!r} failed: {exc}")
                    )
            raise

    def _fusable_run(self, batch: list[Ready], start: int) -> int:
        """The end of the run of allreduces from ``start`` that fuse into one buffer."""
        first = batch[start]
        key = _fusion_key(first)
        total = _nbytes(first)
        end = start + 1
        while end < len(batch):
            nxt = batch[end]
            if (nxt.entry.kind != ALLREDUCE or nxt.error is not None
                    or nxt.members != first.members or _fusion_key(nxt) != key):  # fmt: skip
                break
            total += _nbytes(nxt)
            if total > self._fusion:
                break
            end += 1
        return end

    # -- allreduce ------------------------------------------------------------------------
    def _allreduce(self, readies: list[Ready]) -> None:
        group, ranks = self._group_of(readies[0].entry.ps_id)
        sig = readies[0].entry.signatures[_any(readies[0])]
        op, pre = sig.op, sig.prescale
        pieces = [_inputs(r) for r in readies]
        flat = [scale(t, pre).reshape(-1) for ts in pieces for t in ts]
        # One buffer per dtype (a grouped request may hold several): each type is reduced in
        # its own type, never cast to another.
        by_type: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(flat):
            by_type.setdefault(t.dtype, []).append(i)
        reduced: list[torch.Tensor] = [flat[0]] * len(flat)
        for dtype, members in by_type.items():
            parts = [flat[i] for i in members]
            buf = wire(parts[0].clone() if len(parts) == 1 else torch.cat(parts))
            if len(ranks) > 1:
                dist.all_reduce(buf, op=_REDUCE[op], group=group)
            buf, offset = buf.to(dtype), 0
            for i in members:
                reduced[i] = buf[offset : offset + flat[i].numel()]
                offset += flat[i].numel()
        factor = result_factor(op, sig.postscale, len(ranks))
        done = iter(reduced)
        for ready, tensors in zip(readies, pieces, strict=True):
            _deliver(ready, [scale(next(done).view(t.shape), factor) for t in tensors])

    def _inline(self, ready: Ready) -> None:
        """An allreduce whose every copy came with the round (requests.inline): reduced
        here from each rank's bytes, in the set's rank order (so every rank computes the same
        bits), with Horovod's scaling; a rank that joined counts as zeros."""
        sig = ready.entry.signatures[_any(ready)]
        op, pre = sig.op, sig.prescale
        dtype = dtypes(sig)[0]  # one type: requests.inline takes no grouped mix
        total: torch.Tensor | None = None
        for rank in ready.members:
            got = ready.entry.locals.get(rank)
            if got is None:  # joined: zeros, as on the wire
                part = torch.zeros(nbytes(sig) // dtype.itemsize, dtype=dtype)
            else:
                part = torch.frombuffer(bytearray(got[0]), dtype=torch.uint8).view(dtype)
            part = scale(part, pre)
            total = part if total is None else _combine(total, part, op)
        assert total is not None
        factor = result_factor(op, sig.postscale, len(ready.members))
        outs, offset = [], 0
        for shape in sig.shapes:
            n = int(torch.Size(shape).numel())
            outs.append(scale(total[offset : offset + n].view(shape), factor).clone())
            offset += n
        _deliver(ready, outs)

    # -- the others -----------------------------------------------------------------------
    def _single(self, ready: Ready) -> None:
        kind = ready.entry.kind
        if kind in (BARRIER, PROCESS_SET):  # agreement is all they need
            _deliver(ready, None)
            return
        group, ranks = self._group_of(ready.entry.ps_id)
        assert ready.mine is not None  # only allreduce and barrier run on a joined rank
        run = {ALLGATHER: self._allgather, BROADCAST: self._broadcast,
               ALLTOALL: self._alltoall, REDUCESCATTER: self._reducescatter}[kind]  # fmt: skip
        _deliver(ready, run(ready, group, ranks))

    def _allgather(self, ready: Ready, group: Any, ranks: Sequence[int]) -> list[torch.Tensor]:
        assert ready.mine is not None
        outs = []
        for i, t in enumerate(ready.mine.tensors):
            firsts = [ready.entry.locals[r][i] for r in ranks]
            top = max(firsts)
            padded = torch.zeros((top, *t.shape[1:]), dtype=t.dtype, device=t.device)
            padded[: t.shape[0]] = t
            padded = wire(padded)
            parts = [torch.empty_like(padded) for _ in ranks]
            if len(ranks) > 1:
                dist.all_gather(parts, padded, group=group)
            else:
                parts = [padded]
            outs.append(
                torch.cat([p[:n] for p, n in zip(parts, firsts, strict=False)], dim=0).to(t.dtype)
            )
        return outs

    def _broadcast(self, ready: Ready, group: Any, ranks: Sequence[int]) -> list[torch.Tensor]:
        assert ready.mine is not None
        root = ready.entry.signatures[self.rank].root
        outs = []
        for t in ready.mine.tensors:
            buf = wire(t.detach().clone().contiguous())
            if len(ranks) > 1:
                dist.broadcast(buf, src=root, group=group)
            outs.append(buf.to(t.dtype))
        return outs

    def _alltoall(self, ready: Ready, group: Any, ranks: Sequence[int]) -> list[torch.Tensor]:
        assert ready.mine is not None
        t = ready.mine.tensors[0].contiguous()
        me = ranks.index(self.rank)
        sent = list(ready.entry.locals[self.rank][0])
        received = [int(ready.entry.locals[r][0][me]) for r in ranks]
        sent_t = wire(t)
        out = torch.empty((sum(received), *t.shape[1:]), dtype=sent_t.dtype, device=t.device)
        if len(ranks) > 1:
            dist.all_to_all_single(out, sent_t, received, sent, group=group)
        else:
            out.copy_(sent_t)
        return [out.to(t.dtype), torch.tensor(received, dtype=torch.int32)]

    def _reducescatter(self, ready: Ready, group: Any, ranks: Sequence[int]) -> list[torch.Tensor]:
        assert ready.mine is not None
        sig = ready.entry.signatures[self.rank]
        me, n = ranks.index(self.rank), len(ranks)
        pre, factor = sig.prescale, result_factor(sig.op, sig.postscale, n)
        flat = [scale(t, pre).reshape(-1) for t in ready.mine.tensors]
        buf = wire(flat[0].clone() if len(flat) == 1 else torch.cat(flat))
        if n > 1:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
        buf = buf.to(flat[0].dtype)
        outs, offset = [], 0
        for t in ready.mine.tensors:
            whole = buf[offset : offset + t.numel()].view(t.shape)
            offset += t.numel()
            start, stop = scatter_rows(t.shape[0], n, me)
            outs.append(scale(whole[start:stop].clone(), factor))
        return outs


def _combine(a: torch.Tensor, b: torch.Tensor, op: int) -> torch.Tensor:
    """One step of a reduction, in the tensors' own type (integers wrap as on the wire)."""
    if op in (SUM, AVERAGE):
        return a.logical_or(b) if a.dtype == torch.bool else a + b
    if op == MIN:
        return torch.minimum(a, b)
    if op == MAX:
        return torch.maximum(a, b)
    return a * b  # PRODUCT


def scatter_rows(rows: int, n: int, index: int) -> tuple[int, int]:
    """The rows of a reducescatter's first dimension that rank ``index`` of ``n`` receives:
    an equal share each, the first ``rows % n`` ranks one more (Horovod's split)."""
    base, extra = divmod(rows, n)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _any(ready: Ready) -> int:
    return next(iter(ready.entry.signatures))


def _inputs(ready: Ready) -> list[torch.Tensor]:
    """This rank's tensors, or zeros of the agreed shapes on a rank that joined."""
    if ready.mine is not None:
        return [t.detach() for t in ready.mine.tensors]
    sig = ready.entry.signatures[_any(ready)]
    device = torch.device("cuda", torch.cuda.current_device()) if sig.device == "cuda" else "cpu"
    return [torch.zeros(shape, dtype=dtype, device=device)
            for shape, dtype in zip(sig.shapes, dtypes(sig), strict=True)]  # fmt: skip


def _fusion_key(ready: Ready) -> tuple[Any, ...]:
    sig = ready.entry.signatures[_any(ready)]
    return (ready.entry.ps_id, sig.dtype, sig.device, sig.op, sig.prescale, sig.postscale)


def _nbytes(ready: Ready) -> int:
    return nbytes(ready.entry.signatures[_any(ready)])


def _deliver(ready: Ready, outs: list[torch.Tensor] | None) -> None:
    """Hand the results to this rank's caller: into its output tensors when it asked for the
    operation in place, else as new tensors."""
    mine = ready.mine
    if mine is None:
        return
    if outs is not None and mine.outputs is not None:
        for target, value in zip(mine.outputs, outs, strict=False):
            with torch.no_grad():
                target.copy_(value)
        outs = list(mine.outputs) + outs[len(mine.outputs) :]
    mine.handle.finish(outs)
