"""What a rank asks of the others: a named request, what every rank must agree on, and the
handle the caller waits on.

A request's ``signature`` is what every rank of its process set must send alike (the
operation, dtype, device, shapes but the first dimension where ranks may differ, the
reduction, the root); ``local`` is what may differ and is exchanged with it (an allgather's
first dimension, an alltoall's splits). Ranks that disagree get an error naming both sides,
as Horovod's coordinator gives. The records of a negotiation round live here too, each named
(what a rank sends in a round, the table entry every rank keeps, a request found ready), and
Horovod's arithmetic's one rule for the final scaling (:func:`result_factor`).

Example:
    >>> h = Handle("allreduce.x")
    >>> h.finish(3); h.done(), h.wait()
    (True, 3)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

ALLREDUCE, ALLGATHER, BROADCAST = "allreduce", "allgather", "broadcast"
ALLTOALL, REDUCESCATTER, BARRIER = "alltoall", "reducescatter", "barrier"
#: Registering a process set: every rank must ask for the same ranks, in the same order.
PROCESS_SET = "add_process_set"

#: Horovod's reduction ops, by the values ``horovod.torch`` gives them.
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4, 5
OP_NAMES = {AVERAGE: "Average", SUM: "Sum", ADASUM: "Adasum", MIN: "Min", MAX: "Max",
            PRODUCT: "Product"}  # fmt: skip


class Signature(NamedTuple):
    """What every rank of a set must send alike for one request. ``dtype`` is one name, or
    one per tensor for a grouped allreduce of several types; ``shapes`` leave out the first
    dimension where ranks may differ (allgather, alltoall); ``arguments`` is the number of
    tensors, or what else ranks must agree on (a process set's ranks)."""

    operation: str
    dtype: str | tuple[str, ...] = ""
    device: str = ""
    shapes: tuple[tuple[int, ...], ...] = ()
    op: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    arguments: Any = ()


#: How a mismatch names each field of a :class:`Signature` (Horovod's words).
SIGNATURE_WORDS = ("operation", "data type", "device", "tensor shapes", "reduction op",
                   "prescale factor", "postscale factor", "root rank", "arguments")  # fmt: skip


class Announcement(NamedTuple):
    """A request as a round carries it, whole (its first time), else as
    :class:`CachedAnnouncement`."""

    name: str
    kind: str
    ps_id: int
    signature: Signature
    local: tuple[Any, ...]

    def agreed(self) -> tuple[str, str, int, Signature]:
        """What every rank must announce alike (the response cache's key)."""
        return (self.name, self.kind, self.ps_id, self.signature)


class CachedAnnouncement(NamedTuple):
    """A request every rank has agreed on before: its number in the response cache, and
    what may differ this time."""

    number: int
    local: tuple[Any, ...]


class Handle:
    """One request's completion: its result or its error, set once by the engine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def finish(self, result: Any) -> None:
        self._result = result
        self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait_done(self, seconds: float) -> bool:
        """Whether it is done within ``seconds``."""
        return self._event.wait(seconds)

    def wait(self) -> Any:
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._result


@dataclass
class Request:
    """One collective asked for by this rank (never sent whole: only its announcement)."""

    name: str
    kind: str
    ps_id: int
    signature: Signature
    local: tuple[Any, ...] = ()
    tensors: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] | None = None  # in place: the results go here
    params: dict[str, Any] = field(default_factory=dict)
    handle: Handle = field(init=False)

    def __post_init__(self) -> None:
        self.handle = Handle(self.name)

    def announcement(self) -> Announcement:
        return Announcement(self.name, self.kind, self.ps_id, self.signature, self.local)


def result_factor(op: int, postscale: float, size: int) -> float:
    """What a reduction's sum is multiplied by at the end (Horovod's arithmetic: the inputs
    were multiplied by the prescale factor; ``Average`` divides by the set's size there):
    one rule for every path that reduces (engine.execute, the gradient lane)."""
    return postscale / size if op == AVERAGE else postscale


#: An allreduce of CPU tensors up to this many bytes travels inside the negotiation round
#: that agrees on it: every rank reduces the gathered copies itself, in rank order, and no
#: second collective runs (a round costs one small allgather; gloo's allreduce of 16 bytes
#: or more costs twice that again here: docs/benchmarks.md). A round's slot is 4 KiB
#: whatever it carries (exchange.SLOT_BYTES): three such payloads fit in one.
INLINE_BYTES = 1024


def dtypes(sig: Signature) -> list[torch.dtype]:
    """Each tensor's dtype in a signature (one name for all, or one per tensor)."""
    names = sig.dtype if isinstance(sig.dtype, tuple) else (sig.dtype,) * len(sig.shapes)
    return [getattr(torch, name) for name in names]


def nbytes(sig: Signature) -> int:
    """The bytes of a signature's tensors, all together."""
    return sum(int(torch.Size(s).numel()) * d.itemsize
               for s, d in zip(sig.shapes, dtypes(sig), strict=True))  # fmt: skip


def inline(sig: Signature) -> bool:
    """Whether an allreduce of this signature travels in its round (the same answer on
    every rank: it depends on what they agreed on alone)."""
    if sig.operation != ALLREDUCE or sig.device != "cpu" or not isinstance(sig.dtype, str):
        return False
    return bool(sig.dtype) and nbytes(sig) <= INLINE_BYTES


def payload(tensors: list[torch.Tensor]) -> bytes:
    """The tensors' bytes, one after another (any dtype: viewed as bytes)."""
    return b"".join(t.detach().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors)


def describe(t: torch.Tensor) -> tuple[str, str, tuple[int, ...]]:
    """``(dtype, device type, shape)`` of a tensor, as compared across ranks."""
    return (str(t.dtype).replace("torch.", ""), t.device.type, tuple(t.shape))


def scale_key(factor: float) -> float:
    """A scale factor as ranks compare it (a float, exactly)."""
    return float(factor)


def mismatch_message(kind: str, what: str, mine: Any, theirs: Any, ranks: tuple[int, int]) -> str:
    """Horovod's wording, with the two ranks named."""
    return (
        f"Mismatched {kind} {what}: rank {ranks[0]} sent {mine}, but rank {ranks[1]} sent "
        f"{theirs}. Every rank must call the same collectives with the same arguments."
    )


def first_difference(kind: str, sigs: dict[int, Signature],
                     fields: tuple[str, ...] = SIGNATURE_WORDS) -> str:  # fmt: skip
    """The first field in which two ranks' signatures differ, worded as Horovod does."""
    ranks = sorted(sigs)
    base = ranks[0]
    for other in ranks[1:]:
        a, b = sigs[base], sigs[other]
        if a == b:
            continue
        for i, name in enumerate(fields):
            if i >= len(a) or i >= len(b) or a[i] != b[i]:
                left = a[i] if i < len(a) else None
                right = b[i] if i < len(b) else None
                return mismatch_message(kind, name, left, right, (base, other))
        return mismatch_message(kind, "arguments", a, b, (base, other))
    return f"Mismatched {kind}"  # pragma: no cover - called only on a difference


# -- a round's records ----------------------------------------------------------------------
class Flags(NamedTuple):
    """What a rank tells the others in every round, besides its new requests."""

    joined: bool  # it called join() and serves the others' allreduces with zeros
    leaving: bool  # it called shutdown()
    waiting: bool  # a caller is blocked on this set (the deadlock watch)
    declaring: bool  # the set's first rank declares a deadlock this round


class Message(NamedTuple):
    """One rank's part of a round."""

    flags: Flags
    announced: list[Announcement | CachedAnnouncement]


@dataclass
class Entry:
    """One request name as every rank sees it: who announced what."""

    kind: str
    ps_id: int
    signatures: dict[int, Signature] = field(default_factory=dict)
    locals: dict[int, tuple[Any, ...]] = field(default_factory=dict)


@dataclass
class Ready:
    """A request every member announced: its table entry and this rank's own request
    (``None`` on a rank that joined and serves it with zeros)."""

    key: tuple[int, str]
    entry: Entry
    mine: Request | None
    members: tuple[int, ...]
    error: str | None = None
