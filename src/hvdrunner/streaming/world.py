"""The job's world as Mosaic Streaming reads it, checked before a ``StreamingDataset`` exists.

Streaming reads the world from torch's variables only (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), uses ``torch.distributed`` for its barriers, and
assumes every host runs the same number of ranks, numbered host by host: it places rank ``r``
on node ``r // LOCAL_WORLD_SIZE``, and each node's first rank sets up that node's shared
memory. HorovodRunner sets those variables in every rank; a world Streaming would misread
(ranks spread unevenly over hosts, a launcher that set only Horovod's variables, no
``torch.distributed`` to meet through) is refused here with the fix instead of hanging in a
barrier or reading another host's shared memory.

Example:
    >>> problem(rank=2, size=3, local_rank=0, local_size=1, hosts=2)
    'this job runs 3 ranks on 2 hosts: Mosaic Streaming needs the same number of ranks on every host (np a multiple of the hosts, as many slots on each)'
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from hvdrunner import distributed

#: The variables Streaming reads, and where hvdrunner reads the same value.
TORCH_NAMES = {
    "RANK": distributed.rank, "WORLD_SIZE": distributed.size,
    "LOCAL_RANK": distributed.local_rank, "LOCAL_WORLD_SIZE": distributed.local_size,
}  # fmt: skip


def problem(rank: int, size: int, local_rank: int, local_size: int, hosts: int) -> str | None:
    """What Streaming would get wrong about this rank's world, or ``None``.

    ``hosts``: the hosts that run a rank of this rank's local rank (Horovod's cross size).
    On the busiest host's last local rank the count is short whenever hosts differ, so at
    least one rank of an uneven job refuses it (and HorovodRunner stops the others).
    """
    if size != local_size * hosts:
        return (
            f"this job runs {size} ranks on {hosts} hosts: Mosaic Streaming needs the same "
            f"number of ranks on every host (np a multiple of the hosts, as many slots on each)"
        )
    if rank % local_size != local_rank:
        return (
            f"rank {rank} is local rank {local_rank} of {local_size} on its host, but Mosaic "
            f"Streaming numbers ranks host by host (it would take local rank "
            f"{rank % local_size}): start the job with HorovodRunner, torchrun or horovodrun"
        )
    return None


def check() -> None:
    """Refuse a world Streaming would misread; set torch's variables from Horovod's where a
    launcher set only those (Streaming reads no other); start torch.distributed's group where
    the compiled Horovod runs the job (:func:`_start_torch_group` says why).

    Raises:
        RuntimeError: ranks uneven over hosts or not numbered host by host, or a job of
            several ranks with no ``torch.distributed`` group and no ``MASTER_ADDR`` to make
            one (Streaming's barriers would fail inside its constructor).
    """
    size, local_size = distributed.size(), distributed.local_size()
    found = problem(distributed.rank(), size, distributed.local_rank(), local_size,
                    distributed.cross_size())  # fmt: skip
    if found:
        raise RuntimeError(f"hvdrunner.streaming: {found}.")
    for name, read in TORCH_NAMES.items():
        have, want = os.environ.get(name), str(read())
        if have is not None and have != want:
            raise RuntimeError(
                f"hvdrunner.streaming: {name}={have} but Horovod's variables say {want}: the "
                f"job was started with two launchers' environments. Start it with one."
            )
        os.environ[name] = want
    if size > 1 and not _torch_group() and "MASTER_ADDR" not in os.environ:
        raise RuntimeError(
            "hvdrunner.streaming: Mosaic Streaming meets the other ranks through "
            "torch.distributed, which is not initialised and has no MASTER_ADDR/MASTER_PORT "
            "to start from. Call hvd.init() (hvdrunner.hvd_torch) first, or run the function "
            "with HorovodRunner, which sets them."
        )
    if size > 1 and not _torch_group() and _compiled_horovod():
        _start_torch_group()


def check_registration(prefix: int) -> None:
    """Refuse a dataset whose ranks on one host registered different shared memory.

    Why: Streaming before 0.11 (15.4 ships 0.7.4) has a host's first rank take the next free
    prefix and the others the first one registered for the same folder. With an earlier
    dataset over that folder still alive in a rank, the two differ, and the host's DataLoader
    workers then wait for each other in Streaming's barrier forever: a silent hang, found on
    the 15.4 replica. Later versions raise instead.

    Raises:
        RuntimeError: two ranks of one host hold different prefixes.
    """
    import torch.distributed as dist

    if distributed.size() == 1 or not _torch_group():
        return
    node = distributed.cross_rank()  # the host's index (check() saw ranks numbered by host)
    got: list[Any] = [None] * distributed.size()
    dist.all_gather_object(got, (node, prefix))
    for r, (their_node, theirs) in enumerate(got):
        if their_node == node and theirs != prefix:
            raise RuntimeError(
                f"hvdrunner.streaming: rank {distributed.rank()} registered this dataset's "
                f"shared memory as {prefix:06}, rank {r} on the same host as {theirs:06}: "
                f"another StreamingDataset over the same folder is alive in one of them, and "
                f"Mosaic Streaming before 0.11 then gives the ranks different memory (their "
                f"loaders would wait for each other forever). Drop the earlier dataset (and "
                f"its DataLoader) first, or use Streaming 0.11 or later."
            )


#: How long a rank waits for the others in the group :func:`_start_torch_group` starts.
MEET_TIMEOUT_S = 600.0


def _compiled_horovod() -> bool:
    """Whether this rank initialised a compiled Horovod (``horovod.tensorflow`` or
    ``horovod.torch``), which starts no ``torch.distributed`` group. hvdrunner's engine
    starts one in ``hvd.init()``, from ``MASTER_PORT``: a group started here first would
    take that port from it."""
    return any(m.__name__.startswith("horovod.") for m in distributed.initialized_horovods())


def _start_torch_group() -> None:
    """torch.distributed's default group (gloo), kept for this process's life, where the
    compiled Horovod started none.

    Why: with no group, Streaming starts one in each dataset's constructor and destroys it at
    the end, so two datasets made one after another meet twice at ``MASTER_PORT``: two
    processes that met there again at once failed in 3 tries of 3 (torch 2.3.1: one
    "Connection reset by peer", the other waiting out its timeout, Streaming's 30 minutes).
    And :func:`check_registration` compares the ranks through the group: without it, 15.4's
    Streaming gave the ranks different shared memory in silence and their loaders waited.
    """
    import torch.distributed as dist

    try:
        dist.init_process_group(backend="gloo",
                                timeout=datetime.timedelta(seconds=MEET_TIMEOUT_S))  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - raised again with the cause named
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise RuntimeError(
            f"hvdrunner.streaming: rank {distributed.rank()} could not meet the other ranks "
            f"through torch.distributed at {where} within {MEET_TIMEOUT_S:.0f} s ({exc}): "
            f"every rank must make its dataset, and a rank that failed or makes none leaves "
            f"the others waiting."
        ) from exc


def _torch_group() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def nodes() -> int:
    """The hosts of the job, as Streaming counts them."""
    return max(1, distributed.size() // distributed.local_size())


__all__ = ["check", "check_registration", "nodes", "problem"]
