"""The gradient lane: a ``DistributedOptimizer``'s buckets allreduced as backward makes
them, with no negotiation round per step.

On the negotiated path every bucket waits for one round of the negotiator (an allgather on
the control group) between its last gradient and its allreduce; DDP has no such round. Once
every rank's optimizer agreed on its buckets (one negotiated allreduce of the layout's
fingerprint, engine.optimizer), the buckets of each step go straight to a process group of
their own, in bucket order, each as one flat buffer, while backward goes on. Bucket 0
carries a two-element header at its end, ``[1, fingerprint]`` from a rank that steps and
``[0, 0]`` from a rank that joined: every rank reads from the sum how many ranks stepped
(a joined rank serves zeros until none does, as ``hvd.join()`` promises) and that they all
sent the same layout (else every rank raises). The header's values are small integers, exact
in the buffer's float type.

The arithmetic is the negotiated path's (engine.execute: pre-scale, one sum, ``post / size``
for ``Average``; float32/64 only, scaled in place), so results are the same bit for bit. One optimizer per ``init()`` owns the
lane (the first one that asks; others stay negotiated); ``HVDRUNNER_GRADIENT_LANE=0`` turns
it off. A rank that waits on the lane longer than ``STALL_S`` tells its negotiator, so the
deadlock watch still names ranks that wait on different collectives.

Example:
    >>> Layout(((torch.Size([2]),),), torch.float32, "cpu", 1, 1.0, 1.0).fingerprint() > 0
    True
"""

from __future__ import annotations

import datetime
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hvdrunner.engine.negotiator import Negotiator
from hvdrunner.engine.requests import AVERAGE, SUM, result_factor
from hvdrunner.errors import HorovodInternalError

#: Float types whose sums of the header's small integers are exact (float16 is not).
DTYPES = (torch.float32, torch.float64)
#: Ops the lane runs (a sum underneath); others stay negotiated.
OPS = (AVERAGE, SUM)
#: How long a lane wait lasts before the negotiator hears of it (the deadlock watch).
STALL_S = 1.0
_SLICE_S = 0.05
#: Fingerprints stay below this, so that ``size * fingerprint`` is exact in float32.
_FP_RANGE = 2**11


@dataclass(frozen=True)
class Layout:
    """An optimizer's buckets as the wire sees them: every rank's must be the same."""

    shapes: tuple[tuple[torch.Size, ...], ...]  # per bucket, per gradient
    dtype: torch.dtype
    device: str
    op: int
    pre: float
    post: float

    def fingerprint(self) -> int:
        """A small positive number that differs, almost surely, between layouts."""
        return 1 + zlib.crc32(repr(self).encode()) % (_FP_RANGE - 1)

    def numels(self, index: int) -> list[int]:
        return [int(s.numel()) for s in self.shapes[index]]

    def zeros(self, index: int) -> list[torch.Tensor]:
        """Bucket ``index``'s gradients as zeros (what a joined rank sends)."""
        device = torch.device(self.device)
        if self.device == "cuda":  # this rank's own GPU
            device = torch.device("cuda", torch.cuda.current_device())
        return [torch.zeros(s, dtype=self.dtype, device=device) for s in self.shapes[index]]


def layout_of(groups: Sequence[Sequence[torch.Tensor]], compression: Any, op: int, pre: float,
              post: float) -> Layout | None:  # fmt: skip
    """The buckets ``groups`` (parameters whose gradients exist) as the lane would send them;
    ``None`` when it cannot carry them: sparse, mixed or float16 gradients (after
    ``compression``), mixed devices.
    """
    shapes, kinds = [], set()
    for group in groups:
        for p in group:
            if p.grad is None or p.grad.is_sparse:
                return None
            kinds.add((compression.compress(p.grad)[0].dtype, p.grad.device.type))
        shapes.append(tuple(p.shape for p in group))
    if len(kinds) != 1:
        return None
    ((dtype, device),) = kinds
    if dtype not in DTYPES or op not in OPS:
        return None
    return Layout(tuple(shapes), dtype, device, op, pre, post)


Sources = tuple[tuple[tuple[str, torch.Size, torch.dtype], ...], ...]


def sources(groups: Sequence[Sequence[torch.Tensor]], names: dict[torch.Tensor, str]) -> Sources:
    """What the buckets are made from, per bucket and parameter: its name, shape and dtype."""
    return tuple(tuple((names[p], p.shape, p.dtype) for p in g) for g in groups)


def changed(agreed: Sources, now: Sources) -> str | None:
    """The first parameter whose shape or dtype is not what the ranks agreed on (``None``
    when all are)."""
    for before, after in zip((p for g in agreed for p in g), (p for g in now for p in g),
                             strict=True):  # fmt: skip
        if before != after:
            return (
                f"parameter {before[0]!r} is now {tuple(after[1])} {after[2]}, but the ranks "
                f"agreed on {tuple(before[1])} {before[2]} at the first step"
            )
    return None


CHANGED = (
    "a rank's parameters changed shape or dtype after the ranks agreed on the gradient "
    "lane's buckets (the first step of the optimizer): {what}. Every rank raises; build the "
    "DistributedOptimizer again after changing the model (on every rank), or set "
    "HVDRUNNER_GRADIENT_LANE=0."
)


class Lane:
    """The lane of one ``init()``: its process group, its owner and whether it is on."""

    def __init__(self, group: Any, size: int, negotiator: Negotiator) -> None:
        self.group, self.size = group, size
        self._negotiator = negotiator
        self.owner: object | None = None
        self.layout: Layout | None = None
        self.broken: str | None = None
        self.steps = 0  # steps of the owner's on the lane, served ones included (join())
        self._made_of: Sources = ()

    def release(self) -> None:
        """At ``shutdown()``: drop the process group (the owner may outlive the engine)."""
        self.group = None
        self.broken = "Horovod has been shut down; call hvd.init() first."

    def claim(self, owner: object) -> bool:
        """Whether ``owner`` may use the lane (the first to ask owns it)."""
        if self.owner is None:
            self.owner = owner
        return self.owner is owner

    def accept(self, layout: Layout, made_of: Sources) -> None:
        """Every rank agreed on ``layout``, built from ``made_of``: the owner's next steps
        take the lane."""
        self.layout, self._made_of = layout, made_of

    def start(self, made_of: Sources) -> Step:
        """A step of the owner's buckets (its gradients posted as they are ready), built
        from ``made_of`` now. When that differs from what the ranks agreed on, the step
        still sends buffers of the agreed sizes (zeros: a buffer of another size would abort
        gloo on every rank), with a header every rank reads as a mismatch, and this rank
        names the parameter."""
        if self.broken is not None:
            raise RuntimeError(self.broken)
        assert self.layout is not None
        what = changed(self._made_of, made_of)
        return Step(self, self.layout, stepping=True, changed=what)

    def serve_joined(self) -> None:
        """``hvd.join()`` on this rank: serve the others' steps with zeros until every rank
        joined (a step whose header counts no rank that stepped)."""
        assert self.layout is not None
        layout = self.layout
        while True:
            step = Step(self, layout, stepping=False)
            step.post(0, layout.zeros(0))
            step.wait(0)
            if step.stepped == 0:
                return
            self.steps += 1
            for index in range(1, len(layout.shapes)):
                step.post(index, layout.zeros(index))
            step.finish()

    def wait(self, work: Any, cuda: bool) -> None:
        """Until ``work`` ends; after ``STALL_S`` the negotiator's deadlock watch counts
        this rank as waiting (and its verdict ends the wait here too). NCCL's work is waited
        for whole: its timed waits may abort the communicator, and its watchdog bounds it."""
        if cuda:
            self._waited(work, None)
            return
        if self._waited(work, STALL_S):
            return
        seen = self._negotiator.deadlocks
        with self._negotiator.waiting(on_lane=True):
            while not self._waited(work, _SLICE_S):
                if self._negotiator.deadlocks != seen:  # the cause, before what follows
                    self.broken = (
                        f"the optimizer's gradient allreduce (gradient lane) cannot finish: "
                        f"{self._negotiator.deadlock_error}"
                    )
                    raise RuntimeError(self.broken)
                if self._negotiator.broken is not None:
                    raise HorovodInternalError(str(self._negotiator.broken))

    def _waited(self, work: Any, seconds: float | None) -> bool:
        """Whether ``work`` ended within ``seconds`` (``None``: however long it takes).
        A timed wait that ends early raises and leaves the work running (no callback: one
        left on a work that never ends crashes the process at exit)."""
        try:
            if seconds is None:
                work.wait()
            else:
                work.wait(datetime.timedelta(seconds=seconds))
            return True
        except RuntimeError as exc:
            if seconds is not None and not work.is_completed():
                return False  # timed out
            self.broken = f"the gradient lane failed: {exc}"
            raise HorovodInternalError(
                f"gradient allreduce failed: {exc} (a peer rank probably died, left or shut down)"
            ) from exc


class Step:
    """One step's buckets on the lane: posted in bucket order, waited for in order."""

    def __init__(self, lane: Lane, layout: Layout, stepping: bool,
                 changed: str | None = None) -> None:  # fmt: skip
        self._lane, self._layout = lane, layout
        self._changed = changed
        # A changed rank sends fingerprint 0: the sum then differs from stepped * fingerprint.
        fp = 0.0 if changed else float(layout.fingerprint())
        self._header = (1.0, fp) if stepping else (0.0, 0.0)
        self._ready: dict[int, list[torch.Tensor]] = {}
        self._posted: list[tuple[Any, torch.Tensor]] = []
        self.stepped = -1  # ranks that stepped, known once bucket 0 is back

    @property
    def next_index(self) -> int:
        return len(self._posted)

    def ready(self, index: int, tensors: Sequence[torch.Tensor]) -> None:
        """Bucket ``index``'s (compressed) gradients exist: post it, and every later one
        already ready, once the buckets before it are posted."""
        self._ready[index] = list(tensors)
        while self.next_index in self._ready:
            i = self.next_index
            self.post(i, self._ready.pop(i))

    def post(self, index: int, tensors: Sequence[torch.Tensor]) -> None:
        assert index == self.next_index, (index, self.next_index)
        layout = self._layout
        shapes = tuple(t.shape for t in tensors)
        if self._changed is None and shapes != layout.shapes[index]:  # after the header went
            self._changed = f"bucket {index} holds {[tuple(s) for s in shapes]}"
        if self._changed is not None:
            tensors = layout.zeros(index)  # the agreed sizes: the peers' buffers match
        flat = [t.detach().reshape(-1) for t in tensors]
        grads = sum(t.numel() for t in flat)
        if index == 0:
            flat.append(torch.tensor(self._header, dtype=layout.dtype, device=flat[0].device))
        buf = flat[0].clone() if len(flat) == 1 else torch.cat(flat)
        if buf.dtype != layout.dtype:
            raise RuntimeError(
                f"a gradient became {buf.dtype} after the ranks agreed on {layout.dtype} for "
                f"the gradient lane; set HVDRUNNER_GRADIENT_LANE=0 for models whose gradients "
                f"change type between steps"
            )
        if layout.pre != 1.0:  # the negotiated path's t * pre, in place on the copy
            buf[:grads].mul_(layout.pre)
        work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self._lane.group, async_op=True)
        self._posted.append((work, buf))

    def wait(self, index: int) -> torch.Tensor:
        work, buf = self._posted[index]
        self._lane.wait(work, buf.is_cuda)
        if index == 0:
            self._check_header(buf)
        return buf

    def _check_header(self, buf: torch.Tensor) -> None:
        stepped, fingerprints = (round(float(v)) for v in buf[-2:])
        fp = self._layout.fingerprint()
        if self._changed is not None:
            self._lane.broken = CHANGED.format(what=f"on this rank, {self._changed}")
            raise RuntimeError(self._lane.broken)
        if fingerprints != stepped * fp:
            self._lane.broken = CHANGED.format(what="on another rank (it names the parameter)")
            raise RuntimeError(self._lane.broken)
        self.stepped = stepped

    def finish(self) -> list[list[torch.Tensor]]:
        """Every bucket's results, scaled as the negotiated path scales them (all buckets
        must be posted)."""
        layout = self._layout
        assert self.next_index == len(layout.shapes), "a bucket was never posted"
        factor = result_factor(layout.op, layout.post, self._lane.size)
        if self._header[0]:
            self._lane.steps += 1
        results = []
        for index in range(len(layout.shapes)):
            buf = self.wait(index)
            outs, offset = [], 0
            if factor != 1.0:  # the negotiated path's t * factor, in place (no second copy)
                buf.mul_(factor)
            for shape, n in zip(layout.shapes[index], layout.numels(index), strict=True):
                outs.append(buf[offset : offset + n].view(shape))
                offset += n
            results.append(outs)
        return results


SPARSE_ON_LANE = (
    "a sparse gradient appeared after the ranks' optimizers agreed on dense buckets for the "
    "gradient lane; pass sparse_as_dense=True or set HVDRUNNER_GRADIENT_LANE=0"
)
Buckets = Sequence[tuple[torch.Tensor, ...]]


class Reducer:
    """One optimizer's side of the lane, as a DDP reducer: the one offer every rank answers,
    each step's buckets posted as backward completes them, and the reduced gradients put
    back. The optimizer keeps which buckets backward completed; this keeps the rest.

    ``offering``: the ranks have not answered yet (only the global set's optimizers ask)."""

    def __init__(self, buckets: Buckets, names: dict[torch.Tensor, str], compression: Any,
                 offering: bool) -> None:  # fmt: skip
        self._buckets = list(buckets)
        self._index = {bucket: i for i, bucket in enumerate(self._buckets)}
        self._names, self._compression = names, compression
        self.offering = offering
        self.lane: Lane | None = None
        self.step: Step | None = None  # the step in flight: buckets posted, not finished
        self._ctx: dict[int, list[Any]] = {}

    def active(self, current: Lane | None) -> bool:
        """Whether this optimizer's steps take ``current`` (the running engine's lane); a
        new ``init()`` made another lane, and the ranks must agree again."""
        if self.lane is not None and self.lane is not current:
            self.lane, self.step, self.offering = None, None, True
        return self.lane is not None

    def offer(self, lane: Lane | None, op: int, pre: float, post: float,
              agree: Callable[[torch.Tensor], torch.Tensor]) -> None:  # fmt: skip
        """After a negotiated step: ask the ranks, once, to take the lane from the next
        step (``agree``: the negotiated sum over the set). A rank that cannot sends
        ``[1, 0]`` (everyone stays negotiated for good); a joined rank's zeros defer the
        answer to the next step."""
        if lane is None or not lane.claim(self):
            self.offering = False
            return
        layout = layout_of(self._buckets, self._compression, op, pre, post)
        fp = layout.fingerprint() if layout is not None else 0
        got = agree(torch.tensor([1, fp], dtype=torch.int64))
        ranks, fingerprints = int(got[0]), int(got[1])
        if ranks < lane.size:
            return
        self.offering = False
        if layout is not None and fingerprints == ranks * fp:
            lane.accept(layout, sources(self._buckets, self._names))
            self.lane = lane

    def post(self, bucket: tuple[torch.Tensor, ...]) -> None:
        """``bucket``'s gradients (all exist) go out, compressed, once the buckets before
        it did; the step starts with the first bucket posted."""
        assert self.lane is not None
        if self.step is None:
            self.step = self.lane.start(sources(self._buckets, self._names))
        sent, ctxs = [], []
        for p in bucket:
            if p.grad is None or p.grad.is_sparse:
                raise RuntimeError(SPARSE_ON_LANE)
            t, ctx = self._compression.compress(p.grad)
            sent.append(t)
            ctxs.append(ctx)
        index = self._index[bucket]
        self._ctx[index] = ctxs
        self.step.ready(index, sent)

    def finish(self) -> None:
        """Wait for every bucket (all posted) and put the reduced, decompressed gradients in
        place of the local ones."""
        try:
            assert self.step is not None
            results = self.step.finish()
        finally:
            self.step = None
        for index, (bucket, outs) in enumerate(zip(self._buckets, results, strict=True)):
            for p, out, ctx in zip(bucket, outs, self._ctx[index], strict=True):
                grad = p.grad
                assert grad is not None  # posted: it exists
                grad.set_(self._compression.decompress(out, ctx))
