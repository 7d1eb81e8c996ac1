"""Horovod's helpers over the collectives: broadcast a model's parameters or an optimizer's
state from one rank, and send any picklable object.

Example:
    >>> from hvdrunner.engine import state
    >>> state.init()
    >>> broadcast_object({"epoch": 3}), allgather_object("a")
    ({'epoch': 3}, ['a'])
    >>> state.shutdown()
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import cloudpickle
import torch

from hvdrunner.engine import ops, state
from hvdrunner.engine.ops import synchronize
from hvdrunner.engine.process_sets import ProcessSet, global_process_set


def broadcast_parameters(params: Mapping[str, Any] | Iterable[tuple[str, Any]],
                         root_rank: int, process_set: ProcessSet = global_process_set) -> None:  # fmt: skip
    """Overwrite ``params`` (a ``state_dict()`` or ``named_parameters()``) on every rank with
    ``root_rank``'s values, in place."""
    if isinstance(params, Mapping):
        items = sorted(params.items())
    elif isinstance(params, Iterable):
        items = list(params)
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError(
                f"broadcast_parameters: {name!r} is a {type(p).__name__}, not a tensor"
            )
        tensor = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(ops.broadcast_async_(tensor, root_rank, name=f"broadcast.{name}",
                                            process_set=process_set))  # fmt: skip
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              process_set: ProcessSet = global_process_set) -> None:  # fmt: skip
    """Every rank takes ``root_rank``'s optimizer state and options (learning rate,
    momentum, ...), as ``load_state_dict`` of the root's ``state_dict()``."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _create_state(optimizer)
    synced = broadcast_object(optimizer.state_dict(), root_rank, name="broadcast.optimizer_state",
                              process_set=process_set)  # fmt: skip
    if state.rank() != root_rank:
        optimizer.load_state_dict(synced)


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """An optimizer with no state yet gets one as Horovod makes it: one step with zero
    gradients on every trainable parameter (which applies weight decay once, as Horovod's
    does: results then match the compiled horovod's bit for bit)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    hvd_base = getattr(type(optimizer), "_hvd_base", None)
    if hvd_base is not None:  # a DistributedOptimizer: its class's base steps, unsynchronized
        super(hvd_base, optimizer).step()
    else:
        optimizer.step()


def _to_bytes(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor) -> Any:
    return cloudpickle.loads(t.numpy().tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:  # fmt: skip
    """``root_rank``'s ``obj`` (anything cloudpickle can serialise) on every rank.

    Without ``name``, Horovod names the request after the object's type, which differs
    between the root and the others (``None`` elsewhere is common) and stalls; one fixed
    name is used instead."""
    base = name or "broadcast_object"
    if state.rank() == root_rank:
        payload = _to_bytes(obj)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    synchronize(ops.broadcast_async_(length, root_rank, name=f"{base}.sz", process_set=process_set))
    if state.rank() != root_rank:
        payload = torch.zeros(int(length.item()), dtype=torch.uint8)
    synchronize(ops.broadcast_async_(payload, root_rank, name=f"{base}.t", process_set=process_set))
    return obj if state.rank() == root_rank else _from_bytes(payload)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:  # fmt: skip
    """Every rank's ``obj``, in rank order of the process set (one fixed request name
    unless ``name`` is given: the objects' types may differ between ranks)."""
    base = name or "allgather_object"
    payload = _to_bytes(obj)
    sizes = synchronize(ops.allgather_async(torch.tensor([payload.numel()], dtype=torch.int64),
                                            name=f"{base}.sz", process_set=process_set))  # fmt: skip
    gathered = synchronize(ops.allgather_async(payload, name=f"{base}.t", process_set=process_set))
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(_from_bytes(gathered[offset : offset + n]))
        offset += n
    return out
