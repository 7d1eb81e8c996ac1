"""Who the ranks are and how they reach each other: ``init``/``shutdown`` and the topology.

The ranks meet through ``torch.distributed``'s TCP store at ``MASTER_ADDR:MASTER_PORT`` (rank 0
serves it). Where they learn their place, in this order:

- Horovod's environment (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``, ...),
  which HorovodRunner and ``horovodrun`` set;
- torch's standard one (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), which
  ``torchrun``, TorchDistributor and Databricks' serverless ``@distributed`` set;
- neither: a world of one process, as ``horovod.torch`` in a plain Python process.

The store outlives ``shutdown()``: each ``init()`` meets under a new prefix of it, so init after
shutdown (Horovod's own test suite, an elastic reset) never races a closing port. The engine
keeps its own process groups (one for data, one for its negotiation rounds) and initialises
torch's default group too, when nobody has, so libraries that read it see the job.

Example:
    >>> w = World.from_environment({})
    >>> (w.rank, w.size, w.local_rank, w.local_size, w.cross_rank, w.cross_size)
    (0, 1, 0, 1, 0, 1)
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hvdrunner.engine import keepalive
from hvdrunner.engine.settings import INIT_TIMEOUT_ENV, Settings

#: How long a negotiation round may wait for a peer that is busy computing: Horovod has no
#: such bound (a rank may train for hours between collectives); a dead peer is seen at once
#: (its sockets close), and HorovodRunner's stall watchdog bounds the rest.
ROUND_TIMEOUT = datetime.timedelta(days=7)
# A data collective starts only once every rank agreed on it, so it ends promptly or fails
# (settings.DATA_TIMEOUT_ENV). init() waits settings.INIT_TIMEOUT_ENV for every rank to arrive
# (the store at MASTER_ADDR:MASTER_PORT included): a peer that died or never started is named
# then, instead of a wait for the collective timeout.
NOT_ARRIVED = (
    "hvd.init(): rank(s) {missing} of {size} did not arrive within {timeout:.0f} s (a peer "
    "died, was never started, or runs another job's init). Every rank must call hvd.init(); "
    "{env} sets how long to wait."
)
NO_STORE = (
    "hvd.init(): rank 0's store at {addr}:{port} is unreachable ({error}): rank 0 died, was "
    "never started, or MASTER_ADDR/MASTER_PORT name another process. {env} sets how long to wait."
)

NO_ADDRESS = (
    "hvd.init(): this process is rank {rank} of {size}, but MASTER_ADDR and MASTER_PORT are not "
    "set, so it cannot find rank 0. HorovodRunner, torchrun, TorchDistributor and Databricks' "
    "@distributed set them; when you start the processes yourself, set MASTER_ADDR to rank 0's "
    "address and MASTER_PORT to a free port there, in every rank."
)


#: Each place in the job as Horovod's environment and torch's standard one name it.
PAIRS = (("HOROVOD_RANK", "RANK"), ("HOROVOD_SIZE", "WORLD_SIZE"),
         ("HOROVOD_LOCAL_RANK", "LOCAL_RANK"), ("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"),
         ("HOROVOD_CROSS_RANK", "GROUP_RANK"))  # fmt: skip
DISAGREE = (
    "hvd.init(): the environment names two different jobs: {pairs}. HorovodRunner sets both "
    "alike; torchrun, TorchDistributor and @distributed set only torch's, so Horovod's are "
    "left over from another job or shell (unset them: {names}), or were set by hand."
)


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"hvd.init(): {name}={value!r} is not an integer") from None


def _agreed(env: Mapping[str, str]) -> dict[str, int | None]:
    """Each place by Horovod's name, from whichever environment sets it. The rule: where both
    set a place they must agree (a leftover ``HOROVOD_RANK`` under torchrun made two ranks
    both rank 0, and both hung in init; a leftover ``HOROVOD_LOCAL_RANK`` pinned every rank
    to one GPU), else the error names both."""
    places: dict[str, int | None] = {}
    clashes = []
    for horovod, torch_name in PAIRS:
        h, t = _int(env, horovod), _int(env, torch_name)
        if h is not None and t is not None and h != t:
            clashes.append((horovod, h, torch_name, t))
        places[horovod] = h if h is not None else t
    if clashes:
        pairs = ", ".join(f"{a}={x} but {b}={y}" for a, x, b, y in clashes)
        names = " ".join(a for a, *_ in clashes)
        raise ValueError(DISAGREE.format(pairs=pairs, names=names))
    return places


@dataclass(frozen=True)
class World:
    """This process's place in the job, as the environment gives it (``None``: derive it
    from every rank's host name once the ranks have met)."""

    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    cross_rank: int | None
    cross_size: int | None
    master: tuple[str, int] | None

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> World:
        """Read Horovod's variables first, then torch's (see the module docstring)."""
        env = os.environ if env is None else env
        places = _agreed(env)
        rank, size = places["HOROVOD_RANK"], places["HOROVOD_SIZE"]
        if rank is None or size is None:
            rank, size = 0, 1
        if not 0 <= rank < size:
            raise ValueError(f"hvd.init(): rank {rank} is not in a world of {size} ranks")
        local_rank, local_size = places["HOROVOD_LOCAL_RANK"], places["HOROVOD_LOCAL_SIZE"]
        cross_rank, cross_size = places["HOROVOD_CROSS_RANK"], _int(env, "HOROVOD_CROSS_SIZE")
        if size == 1:
            local_rank, local_size, cross_rank, cross_size = 0, 1, 0, 1
        port = _int(env, "MASTER_PORT")
        addr = env.get("MASTER_ADDR")
        master = (addr, port) if addr and port is not None else None
        if size > 1 and master is None:
            raise ValueError(NO_ADDRESS.format(rank=rank, size=size))
        return cls(rank, size, local_rank, local_size, cross_rank, cross_size, master)


@dataclass(frozen=True)
class Topology:
    """Every rank's place, complete."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def topology_from_hosts(world: World, hosts: list[str]) -> Topology:
    """Fill what the environment left out from every rank's host name (``hosts[r]``):
    local ranks number the ranks of one host, cross ranks number the hosts."""
    me = hosts[world.rank]
    order = list(dict.fromkeys(hosts))
    counts = {h: hosts.count(h) for h in order}
    local_rank = world.local_rank
    if local_rank is None:
        local_rank = [r for r, h in enumerate(hosts) if h == me].index(world.rank)
    local_size = world.local_size if world.local_size is not None else counts[me]
    # cross ranks: the hosts that have a rank with this local rank, in order of first rank
    with_slot = [h for h in order if counts[h] > local_rank]
    cross_rank = world.cross_rank if world.cross_rank is not None else with_slot.index(me)
    cross_size = world.cross_size if world.cross_size is not None else len(with_slot)
    return Topology(world.rank, world.size, local_rank, local_size, cross_rank, cross_size)


class _Stores:
    """One TCP store per process (rank 0 serves it), reused by every ``init()``."""

    def __init__(self) -> None:
        self._store: dist.Store | None = None
        self._key: tuple[str, int, int] | None = None
        self.generation = 0

    def next(self, world: World, timeout: float) -> dist.Store:
        """A fresh prefix of the store for this ``init()``, the same on every rank, once
        every rank arrived there (within ``timeout`` seconds, else the error naming who)."""
        if world.size == 1:
            self.generation += 1
            return dist.HashStore()
        assert world.master is not None
        key = (world.master[0], world.master[1], world.size)
        try:
            if self._store is None or self._key != key:
                self._store = dist.TCPStore(
                    world.master[0], world.master[1], world.size, world.rank == 0,
                    timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                )  # fmt: skip
                self._key = key
                self.generation = 0
            self.generation += 1
            store = dist.PrefixStore(f"hvdrunner/{self.generation}/", self._store)
            _meet(store, world, timeout)
        except _NotArrived as exc:  # the store stays: the next init() meets there again
            raise RuntimeError(str(exc)) from None
        except RuntimeError as exc:  # DistStoreError, DistNetworkError: the store is gone
            self._store, self._key = None, None
            raise RuntimeError(NO_STORE.format(addr=key[0], port=key[1], error=exc,
                                               env=INIT_TIMEOUT_ENV)) from exc  # fmt: skip
        return store


class _NotArrived(RuntimeError):
    pass


def _meet(store: dist.Store, world: World, timeout: float) -> None:
    """Wait until every rank has arrived at this ``init()``'s prefix of the store."""
    store.set(f"arrived/{world.rank}", "1")
    keys = [f"arrived/{r}" for r in range(world.size)]
    deadline = time.monotonic() + timeout
    pause = 0.002
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise _NotArrived(NOT_ARRIVED.format(missing=missing, size=world.size,
                                                 timeout=timeout, env=INIT_TIMEOUT_ENV))  # fmt: skip
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


STORES = _Stores()


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, without the warning a CUDA build of torch prints on a
    machine with no GPU driver (every CPU node of a runtime that ships CUDA torch)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="CUDA initialization", category=UserWarning)
        return bool(torch.cuda.is_available())


def data_backend() -> str:
    """gloo for CPU tensors, NCCL for CUDA tensors where torch has both."""
    if cuda_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


@dataclass
class Groups:
    """The process groups of one ``init()``: ``data`` carries tensors, ``control`` the
    negotiation rounds, ``lane`` the gradient lane's buckets (engine.lane; ``None`` when off
    or alone); ``owns_default`` when this init created torch's default group."""

    data: dist.ProcessGroup
    control: dist.ProcessGroup
    owns_default: bool
    lane: dist.ProcessGroup | None = None


def join_world(world: World, settings: Settings) -> tuple[Groups, Topology]:
    """Meet the other ranks: torch's default group (unless one exists), the engine's own
    groups (the gradient lane's when ``settings.lane``), and every rank's host name for the
    topology."""
    owns = False
    data_timeout = settings.data_timeout
    if not dist.is_initialized():
        store = STORES.next(world, settings.init_timeout_s)
        dist.init_process_group(
            data_backend(), store=store, rank=world.rank, world_size=world.size,
            timeout=data_timeout,
        )  # fmt: skip
        owns = True
    elif dist.get_world_size() != world.size or dist.get_rank() != world.rank:
        raise RuntimeError(
            f"hvd.init(): torch.distributed is already initialised as rank {dist.get_rank()} "
            f"of {dist.get_world_size()}, but the environment says rank {world.rank} of "
            f"{world.size}. Start the job with one launcher's environment."
        )
    ranks = list(range(world.size))
    data = dist.new_group(ranks, timeout=data_timeout, backend=data_backend())
    control = dist.new_group(ranks, timeout=ROUND_TIMEOUT, backend="gloo")
    lane_group = None
    if settings.lane and world.size > 1:
        # A bucket waits on its peers' backward, which may take as long as a round does
        # (NCCL keeps the data timeout: its watchdog is what notices a hung peer there).
        backend = data_backend()
        timeout = ROUND_TIMEOUT if backend == "gloo" else data_timeout
        lane_group = dist.new_group(ranks, timeout=timeout, backend=backend)
    hosts: list[str] = [""] * world.size
    dist.all_gather_object(hosts, _host_name(), group=control)
    return Groups(data, control, owns, lane_group), topology_from_hosts(world, hosts)


def _host_name() -> str:
    """This host's identity: its name plus the network namespace (two namespaces on one
    machine are two hosts, as Horovod counts them)."""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}|{netns}"


def leave_world(groups: Groups) -> None:
    """Destroy this init's groups (and torch's default group when this init made it); their
    workers are joined by ``keepalive.join()`` once the engine has let go of them."""
    for group in (groups.data, groups.control, groups.lane):
        keepalive.destroy(group)
    if groups.owns_default:
        keepalive.destroy_default()
