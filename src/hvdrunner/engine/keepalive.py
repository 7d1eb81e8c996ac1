"""How the engine's process groups go: their gloo workers are joined without the GIL.

Before torch 2.8 (pytorch#154976) a ``ProcessGroup``'s destructor joins its backend's
worker threads *holding the GIL*. A gloo worker drops a collective's tensors just after the
collective ends; if Python dropped its own references first, the worker's drop frees a
Python object and needs the GIL, so a group destroyed at that moment deadlocks the rank in
``hvd.shutdown()``. The 15.4 replica (torch 2.3.1) met it after negotiation rounds, gradient
lane steps and data collectives alike; keeping each collective's tensors alive narrowed it
but could not close it (a group has two workers, a data collective's buffers are many).

The backend itself (``ProcessGroupGloo``, ``ProcessGroupNCCL``) is bound with a destructor
that releases the GIL. So the engine holds each group's backends while it destroys the
group and drops its own references to the group; then :func:`join` drops the backends,
whose destructors join the workers with the GIL released: a worker that needs it gets it.
From torch 2.8 the group's own destructor does so, and groups are destroyed as they are.

Example:
    >>> destroy(None); join()
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hvdrunner._versions import major_minor

#: Whether this torch's ``ProcessGroup`` destructor joins its workers holding the GIL; from
#: 2.8 it releases the GIL itself, and groups are destroyed as they are.
GROUP_DESTRUCTOR_HOLDS_GIL = major_minor(torch.__version__) < (2, 8)

#: Destroyed groups (weakly) with their backends, joined by :func:`join` once the group is gone.
_held: list[tuple[Callable[[], Any], list[Any]]] = []


def destroy(group: Any) -> None:
    """Destroy ``group`` (``None`` or a rank's placeholder for a set it is not in: nothing),
    keeping its backends until :func:`join`. A group already gone with a failed peer is
    left as it is."""
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        return
    _hold(group)
    try:
        dist.destroy_process_group(group)
    except (RuntimeError, ValueError):
        pass


def destroy_default() -> None:
    """Destroy torch's default group, as :func:`destroy` does a group."""
    if dist.is_initialized():
        _hold(dist.group.WORLD)
        dist.destroy_process_group()


def join() -> None:
    """Join the workers of the destroyed groups nothing refers to any more, with the GIL
    released; a group something still holds keeps its backends until a later ``join()``
    (else its last reference would join them holding the GIL)."""
    _held[:] = [(ref, backends) for ref, backends in _held if ref() is not None]


def pending() -> int:
    """How many destroyed groups still wait for :func:`join` (something holds them)."""
    return len(_held)


def _hold(group: Any) -> None:
    if not GROUP_DESTRUCTOR_HOLDS_GIL:
        return
    ref: Callable[[], Any]
    try:
        ref = weakref.ref(group)
    except TypeError:  # not weakly referable: its backends go at the next join()
        ref = _gone
    _held.append((ref, _backends_of(group)))


def _gone() -> None:
    return None


def _backends_of(group: Any) -> list[Any]:
    found: dict[int, Any] = {}  # a backend may serve several device types
    for device in getattr(group, "_device_types", None) or (torch.device("cpu"),):
        try:
            backend = group._get_backend(torch.device(device))
        except (RuntimeError, ValueError, AttributeError):
            continue  # no backend for that device (or a torch without the accessor)
        found.setdefault(id(backend), backend)
    return list(found.values())
