"""Horovod's process sets: collectives over a subset of the ranks.

``ProcessSet(ranks)`` names the ranks (global ranks, sorted); ``add_process_set`` registers one
on every rank (a collective: every rank calls it, in the same order) and gives it an id;
``global_process_set`` (id 0) is every rank. Roots of broadcasts stay global ranks, as in
Horovod.

Example:
    >>> ps = ProcessSet([1, 0])
    >>> ps.ranks, ps.process_set_id
    ([0, 1], None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ProcessSet:
    """A set of ranks; ``process_set_id`` is set once it is registered."""

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int]) -> None:
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError(
                "ProcessSet takes a list of process ranks here (an MPI communicator needs "
                "Horovod's MPI build; hvdrunner's engine runs gloo and NCCL)"
            ) from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks")
        self.ranks = ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> int | None:
        """The number of ranks in the set; ``None`` until it is registered."""
        if self.process_set_id is None or self.ranks is None:
            return None
        return len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (``None`` until registered, or outside it)."""
        if self.process_set_id is None or self.ranks is None or _me is None:
            return None
        return self.ranks.index(_me) if _me in self.ranks else None

    def included(self) -> bool | None:
        """Whether this process belongs to the set (``None`` before ``init()``)."""
        if self.ranks is None or _me is None:
            return None
        return _me in self.ranks

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessSet):
            return NotImplemented
        return self.process_set_id == other.process_set_id and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


#: This process's global rank while the engine is initialised (set by engine.state).
_me: int | None = None


def bind(rank: int | None) -> None:
    """Called by ``init()`` and ``shutdown()``: the rank the sets answer for."""
    global _me
    _me = rank


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
