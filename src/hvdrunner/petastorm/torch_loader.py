"""``make_torch_dataloader``'s loader: ``{column: tensor}`` batches of the shard from the
framework-free feed :meth:`PreparedData.batches`, decoded by a ``TransformSpec`` when one is
given, with petastorm's type rules (booleans as ``uint8``, strings and bytes refused by name)."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from hvdrunner.data import PreparedData
from hvdrunner.petastorm.options import ReadOptions, view
from hvdrunner.torch.inputs import to_tensors

#: petastorm's promotions to types torch has (petastorm.pytorch._sanitize_pytorch_types).
_PROMOTE = {np.dtype(np.bool_): np.uint8, np.dtype(np.uint16): np.int32,
            np.dtype(np.uint32): np.int64}  # fmt: skip


def sanitized(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``batch`` with petastorm's type rules for torch: booleans as ``uint8`` (so ``1 - x``
    and ``x + x`` mean what they mean under petastorm), ``uint16``/``uint32`` widened; a
    column of strings or bytes raises, naming it and the fix.

    Example:
        >>> sanitized({"b": np.array([True, False])})["b"].dtype
        dtype('uint8')
    """
    out = {}
    for name, value in batch.items():
        if value.dtype.kind in "OSU":
            raise TypeError(
                f"PyTorch does not support arrays of string or object classes. Found in field "
                f"{name!r}: decode it on the ranks with a TransformSpec (transform_spec=...), "
                f"or leave it out (schema_fields=...)"
            )
        promote = _PROMOTE.get(value.dtype)
        out[name] = value if promote is None else value.astype(promote)
    return out


#: petastorm's words (its loader raises them too): code may match on them.
PARALLEL_ITER_ERROR = "Cannot start a new iteration because last time iteration did not finish."


class DataLoader:
    """Iterate for batches ``{column: tensor}``; each ``iter()`` is a new pass of
    ``num_epochs`` epochs, continuing the epochs' shuffle order. With ``num_epochs=None``
    the one pass never ends: a second ``iter()`` raises, as petastorm's does (it would
    otherwise start again at the first epoch's order).

    Example:
        >>> it = iter(loader)  # doctest: +SKIP
        >>> next(it)["label"].shape
        torch.Size([32])
    """

    def __init__(self, data: PreparedData, opts: ReadOptions) -> None:
        self.batch_size = opts.batch_size
        self._data, self._opts = view(data, opts), opts
        self._passes = 0
        self._open: list[Generator[dict[str, Any], None, None]] = []

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._opts.num_epochs is None and self._passes:
            raise RuntimeError(
                f"{PARALLEL_ITER_ERROR} This loader is endless (num_epochs=None): keep "
                f"iterating its first iterator (next(it)), or pass num_epochs=N, so that each "
                f"iter() is a new pass that continues the epochs' order"
            )
        first = self._passes * (self._opts.num_epochs or 0)
        self._passes += 1
        it = self._pass(first)
        self._open.append(it)
        return it

    def _pass(self, first_epoch: int) -> Generator[dict[str, Any], None, None]:
        o = self._opts
        feed = self._data.batches(
            o.batch_size, shuffle=o.shuffle, seed=o.seed, cur_shard=o.cur_shard,
            shard_count=o.shard_count, first_epoch=first_epoch, in_memory=None,
            passes=o.num_epochs, strict=False,
        )  # fmt: skip
        with contextlib.closing(feed):  # type: ignore[type-var]
            for batch in feed:
                yield to_tensors(sanitized(batch))

    def close(self) -> None:
        """Stop every open iteration (and its read-ahead threads)."""
        for it in self._open:
            it.close()
        self._open.clear()


@contextlib.contextmanager
def torch_dataloader(data: PreparedData, opts: ReadOptions) -> Iterator[DataLoader]:
    """The loader for :meth:`make_torch_dataloader`; closed (threads stopped) on exit."""
    loader = DataLoader(data, opts)
    try:
        yield loader
    finally:
        loader.close()


__all__ = ["DataLoader", "sanitized", "torch_dataloader"]
