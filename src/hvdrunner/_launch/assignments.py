"""Which rank runs where, and the identity of a host: Horovod's rules, without Horovod.

Ranks are numbered host by host (a host's ranks contiguous, in the order the hosts came);
``local_rank`` numbers a host's ranks; ``cross_rank`` numbers the hosts that have a rank of
that local rank. A host is its name plus its kernel namespaces, as Horovod's ``host_hash``
counts it (two network namespaces on one machine are two hosts). The job's secret is 32
random bytes, checked with HMAC-SHA256.

Example:
    >>> [(s.rank, s.local_rank, s.cross_rank, s.cross_size) for s in assign([("a", 2), ("b", 1)])]
    [(0, 0, 0, 2), (1, 1, 0, 1), (2, 0, 1, 2)]
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

SECRET_BYTES = DIGEST_BYTES = 32


@dataclass(frozen=True)
class Slot:
    """One rank's place (the attribute names of Horovod's ``SlotInfo``, which its gloo
    rendezvous server reads)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def assign(hosts: Sequence[tuple[str, int]]) -> list[Slot]:
    """Every rank's slot, for ``hosts`` as ``(host, ranks on it)`` in order."""
    size = sum(n for _, n in hosts)
    slots, rank = [], 0
    for index, (host, n) in enumerate(hosts):
        for local in range(n):
            with_local = [h for h, m in hosts if m > local]
            cross = sum(1 for _, m in hosts[:index] if m > local)
            slots.append(Slot(host, rank, local, cross, size, n, len(with_local)))
            rank += 1
    return slots


def slot_env(slot: Slot) -> dict[str, str]:
    """Horovod's environment for a rank in ``slot``."""
    return {
        "HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size), "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size), "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }  # fmt: skip


def torch_env(slot: Slot, master_addr: str | None, master_port: int | None) -> dict[str, str]:
    """torch's standard environment for a rank (what torchrun sets), so that
    ``torch.distributed`` (hvdrunner's engine, Lightning, Mosaic Streaming...) sees the job as
    Horovod does: rank 0's address and a port that was free there."""
    env = {
        "RANK": str(slot.rank), "WORLD_SIZE": str(slot.size),
        "LOCAL_RANK": str(slot.local_rank), "LOCAL_WORLD_SIZE": str(slot.local_size),
        "GROUP_RANK": str(slot.cross_rank),
    }  # fmt: skip
    if master_addr and master_port:
        env.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})
    return env


def host_id() -> str:
    """This host: its short name and a digest of its full name and kernel namespaces."""
    name = socket.gethostname()
    try:
        spaces = " ".join(
            os.readlink(f"/proc/self/ns/{f}") for f in sorted(os.listdir("/proc/self/ns"))
        )
    except OSError:
        spaces = ""
    digest = hashlib.sha256(f"{name}-{spaces}".encode()).hexdigest()[:32]
    return f"{name.split('.')[0]}-{digest}"


def make_key() -> bytes:
    """A job's secret key."""
    return os.urandom(SECRET_BYTES)


def digest(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def digest_ok(key: bytes, message: bytes, received: bytes) -> bool:
    return hmac.compare_digest(digest(key, message), received)
