"""Rank-side reading of prepared Parquet: equal row ranges, vectorized decode, seeded shuffle.

Global row order is the concatenation of the prepared files (sorted by name). With ``R =
ceil(N / shard_count)`` rows per rank, rank ``r`` owns global rows ``[r*R, (r+1)*R)`` taken
modulo ``N`` (the last rank wraps around to the first rows, so no row is dropped). One pass
over the shard is padded to a whole number of batches from its own start, so every rank runs
exactly ``ceil(R / batch_size)`` full batches per epoch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Column:
    """One fed column: name, numpy dtype, per-row shape (``()`` for scalars) and how many
    list levels it has in Parquet (``shape`` may reshape a flat array)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    depth: int = 0


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one Parquet file."""

    path: str
    start: int
    stop: int


def rows_per_rank(num_rows: int, shard_count: int) -> int:
    return math.ceil(num_rows / shard_count)


def shard_pieces(files: Sequence[tuple[str, int]], shard: int, shard_count: int) -> list[Piece]:
    """The file slices making up ``shard``'s global row range (wrapping at the end)."""
    total = sum(n for _, n in files)
    per = rows_per_rank(total, shard_count)
    lo, hi = shard * per, (shard + 1) * per
    ranges = [(lo, min(hi, total))]
    if hi > total:  # wrap: the last shard tops up from the beginning
        ranges.append((0, hi - total))
    pieces: list[Piece] = []
    for r_lo, r_hi in ranges:
        offset = 0
        for path, n in files:
            a, b = max(r_lo, offset), min(r_hi, offset + n)
            if a < b:
                pieces.append(Piece(path, a - offset, b - offset))
            offset += n
    return pieces


def _to_numpy(array: Any, column: Column) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    depth = column.depth
    # Array columns are list<...> in Parquet: flatten each level (vectorized, no Python
    # loop per row), then reshape to (rows, *shape).
    for _ in range(depth):
        arr = pc.list_flatten(arr)
    values = arr.to_numpy(zero_copy_only=False)
    return values.astype(column.dtype, copy=False).reshape((-1, *column.shape))


class CorruptDataError(RuntimeError):
    """A prepared Parquet file cannot be read as it was written."""


def read_piece(root: str, piece: Piece, columns: Sequence[Column]) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    path = os.path.join(root, piece.path)
    try:
        table = pq.read_table(path, columns=[c.name for c in columns], use_threads=True)
        if table.num_rows < piece.stop:
            raise ValueError(f"{table.num_rows} rows, at least {piece.stop} expected")
        table = table.slice(piece.start, piece.stop - piece.start)
        return {c.name: _to_numpy(table.column(c.name), c) for c in columns}
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise CorruptDataError(
            f"the prepared file {path} cannot be read ({type(exc).__name__}: {exc}). The cache "
            f"under {root} is damaged: run prepare(..., refresh=True) on the driver (or "
            f"data.delete() and prepare again)."
        ) from exc


def iter_batches(
    root: str,
    pieces: Sequence[Piece],
    columns: Sequence[Column],
    batch_size: int,
    shuffle: bool,
    seed: int,
    shard: int,
    first_epoch: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless full batches over the shard; each pass (epoch) is reshuffled with its own seed.

    ``first_epoch`` makes a resumed job see the same order as an uninterrupted one would.
    """
    per_pass = sum(p.stop - p.start for p in pieces)
    steps = math.ceil(per_pass / batch_size)
    epoch = first_epoch
    while True:
        rng = np.random.default_rng([seed, shard, epoch])
        order = rng.permutation(len(pieces)) if shuffle else np.arange(len(pieces))
        emitted = 0
        carry: dict[str, np.ndarray] | None = None
        head: dict[str, np.ndarray] | None = None  # first rows of the pass, for padding
        for i in order:
            chunk = read_piece(root, pieces[i], columns)
            if shuffle:
                perm = rng.permutation(len(next(iter(chunk.values()))))
                chunk = {k: v[perm] for k, v in chunk.items()}
            if head is None:
                head = {k: v[:batch_size] for k, v in chunk.items()}
            if carry is not None:
                chunk = {k: np.concatenate([carry[k], chunk[k]]) for k in chunk}
                carry = None
            n = len(next(iter(chunk.values())))
            full = n - n % batch_size
            for s in range(0, full, batch_size):
                yield {k: v[s : s + batch_size] for k, v in chunk.items()}
                emitted += 1
            if full < n:
                carry = {k: v[full:] for k, v in chunk.items()}
        if emitted < steps:  # pad the last partial batch from the pass's own first rows
            assert carry is not None and head is not None
            need = batch_size - len(next(iter(carry.values())))
            reps = math.ceil(need / len(next(iter(head.values()))))
            pad = {k: np.concatenate([v] * reps)[:need] for k, v in head.items()}
            yield {k: np.concatenate([carry[k], pad[k]]) for k in carry}
        epoch += 1
