"""Tensors a gloo worker may still drop after the engine let go of them.

A gloo worker drops its references to a collective's tensors just *after* the collective ends
(or times out). If Python dropped its own by then, the worker's drop frees a Python object and
needs the GIL. Before torch 2.8 (pytorch#154976) a process group's destructor holds the GIL
while it joins those workers, so such a worker deadlocks the rank in ``hvd.shutdown()``. The
15.4 replica (torch 2.3.1) found it twice: after the last negotiation round (about one job in
four) and after a gradient-lane step whose peer never came. Held here, the worker's drop is
never the last one.

Example:
    >>> last_round(None, torch.zeros(1)); forget()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hvdrunner._versions import major_minor

#: Whether this torch's process-group destructor joins its workers holding the GIL.
GROUP_DESTRUCTOR_HOLDS_GIL = major_minor(torch.__version__) < (2, 8)

#: Each control group's last round's tensors, replaced by its next round (4 KB a rank).
_rounds: dict[int, tuple[torch.Tensor, ...]] = {}
#: What the engine let go of at ``shutdown()`` while a worker may still hold it.
_kept: list[torch.Tensor] = []


def last_round(group: Any, *tensors: torch.Tensor) -> None:
    """Hold a negotiation round's tensors until the group's next round (or ``forget()``)."""
    _rounds[id(group)] = tensors


def keep(tensors: Iterable[torch.Tensor]) -> None:
    """Hold tensors whose collectives may still be in flight (until ``forget()``); needed
    only where the group destructor holds the GIL."""
    if GROUP_DESTRUCTOR_HOLDS_GIL:
        _kept.extend(tensors)


def forget() -> None:
    """At ``init()``: every earlier group is gone and its workers are joined."""
    _rounds.clear()
    _kept.clear()
