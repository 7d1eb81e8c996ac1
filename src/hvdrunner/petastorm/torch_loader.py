"""``make_torch_dataloader``'s loader: ``{column: tensor}`` batches of the shard, equal in
number on every rank, from the framework-free feed :meth:`PreparedData.batches`."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any

from hvdrunner.data import PreparedData
from hvdrunner.petastorm.options import ReadOptions, batches_per_pass, view
from hvdrunner.torch.inputs import to_tensors


class DataLoader:
    """Iterate for batches ``{column: tensor}``; each ``iter()`` is a new pass of
    ``num_epochs`` epochs (endless when ``None``), continuing the epochs' shuffle order.

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
        )  # fmt: skip
        total = batches_per_pass(self._data, o)
        with contextlib.closing(feed):  # type: ignore[type-var]
            for i, batch in enumerate(feed):
                if total is not None and i >= total:
                    return
                yield to_tensors(batch)

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


__all__ = ["DataLoader", "torch_dataloader"]
