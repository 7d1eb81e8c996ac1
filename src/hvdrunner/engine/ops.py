"""Horovod's asynchronous operations: each returns a handle at once; ``poll(handle)`` says
whether it finished and ``synchronize(handle)`` returns its result (or raises its error).

Arguments are checked here, on the caller's thread, before anything is sent: a tensor that
is not contiguous, a reduction an operation does not take, a rank outside the process set.
What must agree between ranks (shapes, dtypes, ops, roots) is checked by every rank against
the others once all asked (engine.negotiator).

Example:
    >>> from hvdrunner.engine import state
    >>> state.init()
    >>> import torch
    >>> synchronize(allreduce_async(torch.ones(2), op=SUM))
    tensor([1., 1.])
    >>> state.shutdown()
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hvdrunner.engine import state
from hvdrunner.engine.process_sets import ProcessSet, global_process_set
from hvdrunner.engine.requests import (
    ADASUM,
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    AVERAGE,
    BARRIER,
    BROADCAST,
    MAX,
    MIN,
    OP_NAMES,
    PRODUCT,
    REDUCESCATTER,
    SUM,
    Handle,
    Request,
    Signature,
    describe,
    inline,
    payload,
    scale_key,
)  # fmt: skip
from hvdrunner.errors import HorovodInternalError

Average, Sum, Adasum, Min, Max, Product = AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT

ADASUM_REFUSED = (
    "op=hvd.Adasum is not supported by hvdrunner's engine: Horovod's Adasum needs its MPI build "
    "(and, on GPUs, NCCL with a power-of-2 number of hosts), which torch.distributed does not "
    "provide. Use op=hvd.Average (the default), or run this job on the compiled horovod."
)
_SUPPORTED = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.bool}  # fmt: skip

_handles: dict[int, tuple[Request, Callable[[Any], Any]]] = {}
_handle_ids = itertools.count(1)
_handles_lock = threading.Lock()


def _check_tensor(t: Any, what: str = "tensor", reduced: bool = False) -> torch.Tensor:
    """Horovod's checks of a tensor; ``reduced``: it is summed (allreduce, reducescatter),
    which Horovod refuses for bool (an average of bools has no bool answer)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _SUPPORTED or (reduced and t.dtype == torch.bool):
        raise ValueError(f"Tensor type {t.type()} is not supported.")
    if not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return t


def reduction(op: int | None, average: bool | None) -> int:
    """Horovod's ``op``/``average`` arguments as one op (``average`` is the deprecated form)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        return AVERAGE if average else SUM
    op = AVERAGE if op is None else op
    if op not in OP_NAMES:
        raise ValueError(f"op must be one of hvd.Average, Sum, Min, Max, Product; got {op!r}")
    if op == ADASUM:
        raise NotImplementedError(ADASUM_REFUSED)
    return op


def _launch(request: Request, finalize: Callable[[Any], Any]) -> int:
    state.submit(request)
    handle = next(_handle_ids)
    with _handles_lock:
        _handles[handle] = (request, finalize)
    return handle


def _name(kind: str, name: str | None) -> str:
    return name if name is not None else state.current().auto_name(kind)


def _signature(kind: str, tensors: Sequence[torch.Tensor], op: int = -1, pre: float = 1.0,
               post: float = 1.0, root: int = -1, full: bool = True) -> Signature:  # fmt: skip
    """What every rank must send alike. The data type is one name, or one per tensor for a
    grouped allreduce of several types (Horovod runs it; each type is reduced in its own
    buffer, engine.execute)."""
    dtypes = tuple(describe(t)[0] for t in tensors)
    devices = {describe(t)[1] for t in tensors}
    if len(devices) > 1 or (len(set(dtypes)) > 1 and kind != ALLREDUCE):
        raise ValueError(f"grouped {kind}: every tensor must have one dtype and one device")
    dtype: Any = dtypes[0] if len(set(dtypes)) == 1 else dtypes
    shapes = tuple(tuple(t.shape) if full else tuple(t.shape[1:]) for t in tensors)
    return Signature(kind, dtype if dtypes else "", devices.pop() if devices else "", shapes,
                     op, scale_key(pre), scale_key(post), root, len(tensors))  # fmt: skip


# -- allreduce ------------------------------------------------------------------------------
def grouped_allreduce_async_impl(tensors: Sequence[torch.Tensor], outputs: list[Any] | None,
                                 name: str | None, op: int, prescale_factor: float,
                                 postscale_factor: float, process_set: ProcessSet) -> int:  # fmt: skip
    """Allreduce ``tensors`` as one request (in place into ``outputs`` when given)."""
    tensors = [_check_tensor(t, reduced=True) for t in tensors]
    if not tensors:
        raise ValueError("grouped allreduce needs at least one tensor")
    ps_id, _ = state.resolve(process_set)
    sig = _signature(ALLREDUCE, tensors, op, prescale_factor, postscale_factor)
    local = (payload(tensors),) if inline(sig) else ()
    request = Request(_name(ALLREDUCE, name), ALLREDUCE, ps_id, sig, local, list(tensors), outputs)
    return _launch(request, lambda outs: outs)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    """Start averaging (or summing...) ``tensor`` over the ranks; the result is a new tensor."""
    op = reduction(op, average)
    return _single(grouped_allreduce_async_impl([tensor], None, name, op, prescale_factor,
                                                postscale_factor, process_set))  # fmt: skip


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    """As :func:`allreduce_async`, the result written into ``tensor``."""
    op = reduction(op, average)
    return _single(grouped_allreduce_async_impl([tensor], [tensor], name, op, prescale_factor,
                                                postscale_factor, process_set))  # fmt: skip


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: int | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    op = reduction(op, average)
    return grouped_allreduce_async_impl(list(tensors), None, name, op, prescale_factor,
                                        postscale_factor, process_set)  # fmt: skip


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    op = reduction(op, average)
    return grouped_allreduce_async_impl(list(tensors), list(tensors), name, op, prescale_factor,
                                        postscale_factor, process_set)  # fmt: skip


def _single(handle: int) -> int:
    """The handle of a one-tensor request returns that tensor, not a list."""
    with _handles_lock:
        request, _ = _handles[handle]
        _handles[handle] = (request, lambda outs: outs[0])
    return handle


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: int | None,
                           process_set: ProcessSet = global_process_set) -> Callable[[], Any]:  # fmt: skip
    """A sparse tensor's allreduce as Horovod does it: its indices and values gathered from
    every rank (duplicates summed when used); returns a callable giving the result."""
    op = reduction(op, None)
    if op not in (AVERAGE, SUM):
        raise ValueError("sparse allreduce takes op=hvd.Average or hvd.Sum")
    t = tensor.coalesce()
    base = _name("sparse_allreduce", name)
    values = allgather_async(
        t.values().contiguous(), name=f"{base}.values", process_set=process_set
    )
    indices = allgather_async(t.indices().t().contiguous(), name=f"{base}.indices",
                              process_set=process_set)  # fmt: skip
    n = len(state.resolve(process_set)[1])

    def result() -> torch.Tensor:
        v = synchronize(values)
        i = synchronize(indices).t()
        if op == AVERAGE:
            v = v / n
        return torch.sparse_coo_tensor(i, v, size=tensor.size())

    return result


# -- the others -----------------------------------------------------------------------------
def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    tensors = [_check_tensor(t) for t in tensors]
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("allgather needs tensors of at least one dimension (not a scalar)")
    ps_id, _ = state.resolve(process_set)
    sig = _signature(ALLGATHER, tensors, full=False)
    local = tuple(int(t.shape[0]) for t in tensors)
    request = Request(_name(ALLGATHER, name), ALLGATHER, ps_id, sig, local, list(tensors))
    return _launch(request, lambda outs: outs)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    """Start concatenating every rank's ``tensor`` along the first dimension (ranks may
    differ in it)."""
    return _single(grouped_allgather_async([tensor], name, process_set))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    """Start giving every rank ``root_rank``'s ``tensor`` (a global rank); a new tensor."""
    return _broadcast(tensor, root_rank, name, process_set, in_place=False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    return _broadcast(tensor, root_rank, name, process_set, in_place=True)


def _broadcast(tensor: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet,
               in_place: bool) -> int:  # fmt: skip
    _check_tensor(tensor)
    ps_id, ranks = state.resolve(process_set)
    if root_rank not in ranks:
        raise ValueError(f"broadcast root_rank={root_rank} is not a rank of {process_set}")
    sig = _signature(BROADCAST, [tensor], root=int(root_rank))
    request = Request(_name(BROADCAST, name), BROADCAST, ps_id, sig, (), [tensor],
                      [tensor] if in_place else None)  # fmt: skip
    return _launch(request, lambda outs: outs[0])


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:  # fmt: skip
    """Start sending rows ``splits[i]`` of ``tensor`` to rank ``i`` of the set (equal
    shares when ``splits`` is None); the result is ``(output, received_splits)``."""
    _check_tensor(tensor)
    ps_id, ranks = state.resolve(process_set)
    n = len(ranks)
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    if splits is None:
        if tensor.shape[0] % n:
            raise ValueError(
                f"alltoall without splits needs the first dimension ({tensor.shape[0]}) to "
                f"divide evenly by the number of ranks ({n}); pass splits=..."
            )
        counts = [tensor.shape[0] // n] * n
    else:
        if isinstance(splits, torch.Tensor):
            if splits.dtype not in (torch.int32, torch.int64):
                raise ValueError("splits must be a tensor of int32 or int64")
            counts = [int(s) for s in splits.reshape(-1).tolist()]
        else:
            counts = [int(s) for s in splits]
        if len(counts) != n or any(c < 0 for c in counts) or sum(counts) != tensor.shape[0]:
            raise ValueError(
                f"alltoall splits {counts} must give one non-negative count per rank ({n}) "
                f"summing to the first dimension ({tensor.shape[0]})"
            )
    sig = _signature(ALLTOALL, [tensor], full=False)
    request = Request(_name(ALLTOALL, name), ALLTOALL, ps_id, sig, (tuple(counts),), [tensor])
    return _launch(request, lambda outs: (outs[0], outs[1]))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: int = AVERAGE, process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:  # fmt: skip
    tensors = [_check_tensor(t, reduced=True) for t in tensors]
    if op not in (AVERAGE, SUM):
        raise RuntimeError(
            f"reducescatter takes op=hvd.Average or hvd.Sum, not {OP_NAMES.get(op, op)}"
        )
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("reducescatter needs tensors of at least one dimension")
    ps_id, _ = state.resolve(process_set)
    sig = _signature(REDUCESCATTER, tensors, op, prescale_factor, postscale_factor)
    request = Request(_name(REDUCESCATTER, name), REDUCESCATTER, ps_id, sig, (), list(tensors))
    return _launch(request, lambda outs: outs)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = AVERAGE,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:  # fmt: skip
    """Start reducing ``tensor`` over the ranks, each receiving its rows of the first
    dimension (the first ``rows % n`` ranks one more)."""
    return _single(grouped_reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                               postscale_factor))  # fmt: skip


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the set got here."""
    ps_id, _ = state.resolve(process_set)
    request = Request(_name(BARRIER, None), BARRIER, ps_id, Signature(BARRIER), ())
    synchronize(_launch(request, lambda outs: None))


def join(device: int = -1) -> int:
    """This rank has no more batches: serve the others' allreduces with zeros until every
    rank joined. Returns the rank that joined last (the same on every rank)."""
    handle = Handle("join")
    state.negotiator_of(0).join(handle)
    lane = state.current().lane
    if lane is not None and lane.layout is None:
        lane = None  # not taken by any optimizer: nothing to serve there
    try:
        if lane is not None:
            joined_at = lane.steps
            lane.serve_joined()  # the others' optimizer steps on the lane get zeros too
        last = int(handle.wait())
    except RuntimeError as exc:
        raise HorovodInternalError(str(exc)) from exc
    if lane is not None:
        # Steps on the lane pass no negotiation round, so the rounds cannot tell who
        # joined last; the lane's step count at each rank's join() can.
        at = synchronize(allgather_async(torch.tensor([joined_at]), name="hvdrunner.join.steps"))
        latest = [r for r, n in enumerate(at.tolist()) if n == int(at.max())]
        last = last if last in latest else latest[-1]
    # Ranks made different numbers of unnamed requests while some had joined: number the
    # next ones afresh on every rank, so they match again.
    state.current().counters.clear()
    return last


# -- handles --------------------------------------------------------------------------------
def poll(handle: int) -> bool:
    """Whether the operation behind ``handle`` finished (``synchronize`` will not block)."""
    with _handles_lock:
        found = _handles.get(handle)
    if found is None:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    return found[0].handle.done()


def synchronize(handle: Any) -> Any:
    """Wait for the operation behind ``handle``; its result. ``None`` for an unknown handle,
    as in Horovod; a callable (``sparse_allreduce_async``) is called."""
    if callable(handle):
        return handle()
    with _handles_lock:
        found = _handles.get(handle)
    if found is None:
        return None
    request, finalize = found
    try:
        result = state.wait(request)
        return finalize(result)
    except HorovodInternalError:
        raise
    except RuntimeError as exc:
        raise HorovodInternalError(str(exc)) from exc
    finally:
        with _handles_lock:
            _handles.pop(handle, None)
