"""Prepared data as torch tensors: equal steps on every rank, reshuffled per epoch, resumable.

Built on :meth:`hvdrunner.data.PreparedData.batches` (the framework-free numpy feed), so the
rows, their order and the padding are exactly the Keras side's. Unlike a
``DistributedSampler``, every rank gets the same number of full batches however uneven the
Spark partitions were: no rank waits in an allreduce for one that ran out.

Example:
    >>> it = batches(data, 64, device=device)            # doctest: +SKIP
    >>> for step in range(data.steps_per_epoch(64)):
    ...     x, y = next(it)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def _tensor(array: np.ndarray, device: Any) -> torch.Tensor:
    if array.dtype.kind in "OSU":
        raise TypeError(
            "a batch holds bytes or strings (a binary or string column), which torch has no "
            "tensor for: decode them on the ranks first, data.transformed(TransformSpec(...), "
            "features=..., label=...) (hvdrunner.data.TransformSpec)"
        )
    # Arrow hands out read-only views; torch would warn on (and could write to) them.
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array).to(device, non_blocking=True)


def to_tensors(structure: Any, device: Any = None) -> Any:
    """numpy arrays (alone, in a tuple or a dict) as tensors on ``device``."""
    if isinstance(structure, np.ndarray):
        return _tensor(structure, device)
    if isinstance(structure, tuple):
        return tuple(to_tensors(s, device) for s in structure)
    if isinstance(structure, dict):
        return {k: to_tensors(v, device) for k, v in structure.items()}
    raise TypeError(f"cannot make a tensor of {type(structure).__name__}")


def batches(
    data: Any,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    first_epoch: int = 0,
    device: Any = None,
    in_memory: bool | None = None,
) -> Iterator[Any]:
    """Endless batches of this rank's shard of ``data`` as tensors on ``device``.

    Each batch is ``(x, y)`` (``x`` a tensor, or a dict of tensors for several feature
    columns; ``y`` the label) or ``x`` alone without a label. One epoch is
    ``data.steps_per_epoch(batch_size)`` batches, the same on every rank; each epoch has its
    own shuffle order (from ``seed``), and ``first_epoch`` resumes that order where an
    uninterrupted job would be. ``in_memory`` (``None``: when the shard fits the memory
    budget): decode the shard once, then gather each batch from memory - what a bare loop
    over tensors in memory does; otherwise pieces stream from disk every epoch.

    Example:
        >>> it = batches(data, 32, first_epoch=3)          # doctest: +SKIP
    """
    feed = data.batches(batch_size, shuffle=shuffle, seed=seed, first_epoch=first_epoch,
                        in_memory=in_memory)  # fmt: skip
    for batch in feed:
        yield to_tensors(data.structure(batch), device)


__all__ = ["batches", "to_tensors"]
