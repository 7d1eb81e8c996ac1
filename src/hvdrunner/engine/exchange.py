"""How a negotiation round's messages travel: every rank's message to every rank of a set,
in one fixed-size allgather on the set's control group when all fit its slot (the common
case: one collective per round), else in a second, exact one.

Example:
    >>> exchange({"new": []}, 1, None)
    [{'new': []}]
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

#: A round's message fits this many bytes in the common case: one collective per round.
SLOT_BYTES = 4096
#: torch >= 2.10 names it all_gather_single (the old name warns); older torch has only that.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def exchange(message: Any, n: int, control: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's ``message`` (``n`` ranks on ``control``): one fixed-size allgather when
    all fit, else a second, exact one (every rank sees who overflowed, so all take the same
    path)."""
    if n == 1:
        return [message]
    data = pickle.dumps(message)
    slot = torch.zeros(SLOT_BYTES, dtype=torch.uint8)
    fits = len(data) <= SLOT_BYTES - 8
    head = len(data) if fits else -1
    slot[:8] = torch.tensor([head], dtype=torch.int64).view(torch.uint8)
    if fits:
        slot[8 : 8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = torch.empty(n * SLOT_BYTES, dtype=torch.uint8)
    _ALL_GATHER(out, slot, group=control)
    rows = out.view(n, SLOT_BYTES)
    heads = [int(rows[i, :8].view(torch.int64)[0]) for i in range(n)]
    if all(h >= 0 for h in heads):
        return [pickle.loads(rows[i, 8 : 8 + h].numpy().tobytes()) for i, h in enumerate(heads)]
    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, message, group=control)
    return gathered
