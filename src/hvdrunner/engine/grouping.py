"""How ``DistributedOptimizer`` names its parameters and groups their gradients.

Example:
    >>> [len(b) for b in buckets(list(torch.nn.Linear(4, 2).parameters()))]
    [2]
    >>> [len(b) for b in buckets([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])]
    [1, 1]
"""

from __future__ import annotations

from typing import Any

import torch

#: A bucket's size (DDP's default ``bucket_cap_mb``), or one parameter alone when larger: the
#: one bucket rule, for ``DistributedOptimizer``'s lane and ``hvdrunner.torch``'s groups.
BUCKET_BYTES = 25 * 2**20


def buckets(
    params: list[torch.Tensor], cap: float = BUCKET_BYTES
) -> list[tuple[torch.Tensor, ...]]:
    """``params`` (in definition order) as groups of at most ``cap`` bytes, last ones first
    (roughly the order backward finishes them). A bucket holds one dtype on one device, as
    DDP's do: a model with float32 and float64 (or float16) parameters gets a bucket per type,
    each reduced in its own type."""
    out: list[list[torch.Tensor]] = []
    current: dict[tuple[torch.dtype, torch.device], int] = {}  # each type's open bucket in out
    size: dict[tuple[torch.dtype, torch.device], int] = {}
    for p in reversed(params):
        key = (p.dtype, p.device)
        nbytes = p.numel() * p.element_size()
        if key not in current or size[key] + nbytes > cap:
            current[key], size[key] = len(out), 0
            out.append([])
        out[current[key]].append(p)
        size[key] += nbytes
    return [tuple(b) for b in out]


def parameter_names(param_groups: list[dict[str, Any]],
                     named: list[tuple[str, torch.Tensor]] | None) -> dict[torch.Tensor, str]:  # fmt: skip
    if named is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, g in enumerate(param_groups)
                for j, p in enumerate(g["params"])}  # fmt: skip
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")  # fmt: skip
    names = [k for k, _ in named]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(dups))  # fmt: skip
    known = {id(v) for _, v in named}
    unnamed = [id(p) for g in param_groups for p in g["params"] if id(p) not in known]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were "
                         "not named. Python object ids: " + ", ".join(map(str, unnamed)))  # fmt: skip
    return {v: k for k, v in sorted(named, key=lambda kv: kv[0])}


def check_groups(groups: Any) -> Any:
    if groups is None:
        return None
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
        return groups
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError(
            "groups should be a non-negative integer or a list of list of torch.Tensor."
        )
    return groups
