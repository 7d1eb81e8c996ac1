"""The engine of one ``init()``: the world, its groups, the registered process sets and the
negotiator; ``init``/``shutdown`` and the topology queries of Horovod's API.

Example:
    >>> init(); (rank(), size(), is_initialized())
    (0, 1, True)
    >>> shutdown(); is_initialized()
    False
"""

from __future__ import annotations

import atexit
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hvdrunner import distributed
from hvdrunner.engine import execute, keepalive, negotiator, timeline, world
from hvdrunner.engine import lane as gradient_lane
from hvdrunner.engine import process_sets as set_registry
from hvdrunner.engine.process_sets import ProcessSet, global_process_set
from hvdrunner.engine.requests import PROCESS_SET, Request, Signature
from hvdrunner.engine.settings import Settings

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclass
class ProcessSetState:
    """A registered process set on this rank: its ranks, groups and negotiator (``None``
    on a rank outside the set)."""

    ranks: tuple[int, ...]
    data: Any
    negotiator: negotiator.Negotiator | None


@dataclass
class Engine:
    """Everything one ``init()`` made; gone at ``shutdown()``."""

    settings: Settings
    topology: world.Topology
    groups: world.Groups
    sets: dict[int, ProcessSetState] = field(default_factory=dict)
    next_set_id: int = 1
    counters: dict[str, itertools.count[int]] = field(default_factory=dict)
    lane: gradient_lane.Lane | None = None  # the gradient lane (engine.lane), when on

    def open_set(self, ps_id: int, ranks: tuple[int, ...], data: Any, control: Any) -> None:
        """Register a set: its negotiator runs on this rank when the rank belongs to it."""
        me = self.topology.rank
        found = None
        if me in ranks:
            run = execute.Executor(me, lambda _: (data, ranks), self.settings.fusion_bytes)
            found = negotiator.Negotiator(control, ranks, me, run, self.settings)
        self.sets[ps_id] = ProcessSetState(ranks, data, found)

    def auto_name(self, kind: str) -> str:
        """``<op>.noname.<n>``: the same on every rank that calls the same ops in order."""
        return f"{kind}.noname.{next(self.counters.setdefault(kind, itertools.count(1)))}"


_lock = threading.RLock()
_engine: Engine | None = None


def current() -> Engine:
    """The running engine, or Horovod's ``ValueError`` naming ``hvd.init()``."""
    if _engine is None:
        raise ValueError(NOT_INITIALIZED)
    return _engine


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | None = None) -> None:
    """Join the job (a no-op when already initialised); ``process_sets`` are registered at
    once, in order, on every rank."""
    global _engine
    if comm is not None:
        raise ValueError(
            "hvd.init(comm=...): an MPI communicator needs Horovod's MPI build; hvdrunner's "
            "engine runs gloo and NCCL (pass process_sets=[hvd.ProcessSet(ranks)] instead)"
        )
    with _lock:
        if _engine is not None:
            return
        keepalive.join()  # an earlier shutdown's groups that were still held then
        settings = Settings.from_environment()
        env = world.World.from_environment()
        groups, topology = world.join_world(env, settings)
        engine = Engine(settings, topology, groups)
        engine.open_set(0, tuple(range(topology.size)), groups.data, groups.control)
        found = engine.sets[0].negotiator
        if groups.lane is not None and found is not None:
            engine.lane = gradient_lane.Lane(groups.lane, topology.size, found)
        _engine = engine
        set_registry.bind(topology.rank)
        global_process_set.ranks = list(range(topology.size))
        for ps in process_sets or ():
            add_process_set(ps)
        path = settings.timeline
        if path and path != "DYNAMIC" and distributed.is_rank0(live_rank=topology.rank):
            timeline.start(path)


def shutdown() -> None:
    """Leave the job: the last round with the other ranks, then the groups go. A no-op when
    not initialised."""
    global _engine
    with _lock:
        engine, _engine = _engine, None
        if engine is None:
            return
        _leave(engine)
        del engine  # the engine's last references to its groups
        # Their workers are joined here, while Python runs and with the GIL released
        # (engine/keepalive.py). Left to the interpreter's exit, a worker that finishes a
        # collective after Python stopped drops a tensor without the GIL and aborts the
        # process ("terminate called without an active exception": 4-6 of 10 two-rank runs
        # that ended without hvd.shutdown()).
        keepalive.join()


def _leave(engine: Engine) -> None:
    for ps_id in sorted(engine.sets, reverse=True):  # the global set last
        _close_set(engine.sets[ps_id], destroy=ps_id != 0)
    if all(s.negotiator is None or not s.negotiator.alive() for s in engine.sets.values()):
        world.leave_world(engine.groups)
    _release(engine)
    set_registry.bind(None)
    timeline.stop()


def _release(engine: Engine) -> None:
    """Drop the engine's references to its groups: the negotiators' (whose threads ended),
    the lane's (which a user's optimizer may keep) and the sets'."""
    if engine.lane is not None:
        engine.lane.release()
    for found in engine.sets.values():
        if found.negotiator is not None:
            found.negotiator.release()
    engine.sets.clear()
    engine.lane = None


def _close_set(found: ProcessSetState, destroy: bool) -> None:
    if found.negotiator is not None:
        found.negotiator.close()
        if destroy and not found.negotiator.alive():
            keepalive.destroy(found.negotiator.control)
    if destroy:
        keepalive.destroy(found.data)


def is_initialized() -> bool:
    return _engine is not None


def submit(request: Request) -> Request:
    found = current().sets.get(request.ps_id)
    if found is None or found.negotiator is None:
        raise ValueError(f"process set {request.ps_id} is not registered on this rank")
    timeline.negotiating(request.kind, request.name)
    return found.negotiator.submit(request)


def negotiator_of(ps_id: int = 0) -> negotiator.Negotiator:
    found = current().sets.get(ps_id)
    if found is None or found.negotiator is None:
        raise ValueError(f"process set {ps_id} is not registered on this rank")
    return found.negotiator


def wait(request: Request) -> Any:
    """``request``'s result: the caller runs its set's rounds meanwhile (the negotiator's
    ``drive``, which also marks it blocked for the deadlock watch)."""
    engine = _engine
    found = engine.sets.get(request.ps_id) if engine is not None else None
    if found is not None and found.negotiator is not None:
        found.negotiator.drive(request.handle)
    return request.handle.wait()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set on every rank (every rank calls this, in the same order)."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    engine = current()
    ranks = tuple(ps.ranks or ())
    size = engine.topology.size
    if not ranks or any(r < 0 or r >= size for r in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(f"a process set needs distinct ranks in [0, {size}); got {list(ranks)}")
    if any(known.ranks == ranks for known in engine.sets.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {ps}")
    _agree_on_set(engine.next_set_id, ranks)
    # Every rank creates every set's groups (torch's rule), members or not.
    data = dist.new_group(list(ranks), timeout=engine.settings.data_timeout,
                          backend=world.data_backend())  # fmt: skip
    control = dist.new_group(list(ranks), timeout=world.ROUND_TIMEOUT, backend="gloo")
    ps.process_set_id = engine.next_set_id
    engine.next_set_id += 1
    engine.open_set(ps.process_set_id, ranks, data, control)
    return ps


def _agree_on_set(ps_id: int, ranks: tuple[int, ...]) -> None:
    """Every rank registers the same set as its ``ps_id``-th (Horovod compares every rank's
    sets): a negotiated request on the global set, so ranks that disagree get an error on
    every rank, and a rank that never registers it is named by the deadlock watch, instead
    of a hang in torch's group creation."""
    sig = Signature(PROCESS_SET, arguments=f"ranks {list(ranks)}")
    request = submit(Request(f"hvdrunner.process_set.{ps_id}", PROCESS_SET, 0, sig))
    wait(request)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set on every rank; ``False`` when it was not registered."""
    engine = current()
    ps_id = process_set.process_set_id
    if ps_id in (None, 0) or ps_id not in engine.sets:
        return False
    _close_set(engine.sets.pop(ps_id), destroy=True)
    process_set._invalidate()
    return True


def resolve(process_set: ProcessSet) -> tuple[int, tuple[int, ...]]:
    """``(id, ranks)`` of a registered set this rank belongs to, or the error naming why."""
    engine = current()
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id not in engine.sets:
        raise ValueError(f"{process_set} is not registered: call hvd.add_process_set() first")
    ranks = engine.sets[ps_id].ranks
    if engine.topology.rank not in ranks:
        raise RuntimeError(
            f"rank {engine.topology.rank} is not in {process_set}: only its ranks may run "
            f"collectives on it"
        )
    return ps_id, ranks


def rank() -> int:
    return current().topology.rank


def size() -> int:
    return current().topology.size


def local_rank() -> int:
    return current().topology.local_rank


def local_size() -> int:
    return current().topology.local_size


def cross_rank() -> int:
    return current().topology.cross_rank


def cross_size() -> int:
    return current().topology.cross_size


atexit.register(shutdown)
