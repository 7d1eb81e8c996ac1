"""Rank-side reading of prepared Parquet: equal row ranges, vectorized decode, seeded shuffle.

Global row order is the concatenation of the prepared files (sorted by name). With ``R =
ceil(N / shard_count)`` rows per rank, rank ``r`` owns global rows ``[r*R, (r+1)*R)`` taken
modulo ``N`` (the last rank wraps around to the first rows, so no row is dropped). One pass
over the shard is padded to a whole number of batches from its own start, so every rank runs
exactly ``ceil(R / batch_size)`` full batches per epoch.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdrunner.errors import CorruptDataError

READ_AHEAD = 2  # pieces decoded ahead of the consumer (threads)


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


def exact_steps(num_rows: int, shard_count: int, batch_size: int) -> int | None:
    """Batches of one pass in which every row counts once (``wrap=False`` shards), the same
    on every shard; ``None`` when some shard would have none (fewer rows than shards).

    A shard's last batch holds what is left: 1 to ``batch_size`` rows, or ``batch_size + 1``
    when the balanced split leaves the larger shards one row past whole batches (so the
    smaller ones need not end on an empty batch).

    Example:
        >>> exact_steps(10, 1, 4), exact_steps(100, 4, 30), exact_steps(9, 4, 2)
        (3, 1, 1)
    """
    base = num_rows // shard_count
    if base == 0:
        return None
    steps = math.ceil(math.ceil(num_rows / shard_count) / batch_size)
    if base <= (steps - 1) * batch_size:  # the smaller shards end on a whole batch
        steps -= 1
    return steps


def shard_pieces(
    files: Sequence[tuple[str, int]], shard: int, shard_count: int, wrap: bool = True
) -> list[Piece]:
    """The file slices making up ``shard``'s global row range (wrapping at the end, so every
    shard has the same rows; ``wrap=False``: each row in exactly one shard, the shards
    balanced to within a row, for a pass that must count every row once)."""
    total = sum(n for _, n in files)
    per = rows_per_rank(total, shard_count)
    lo, hi = shard * per, (shard + 1) * per
    if not wrap:  # balanced: the first total % count shards one row more
        base, extra = divmod(total, shard_count)
        lo = shard * base + min(shard, extra)
        ranges = [(lo, lo + base + (1 if shard < extra else 0))]
    else:  # rows lo..hi taken modulo total: every shard has exactly `per` rows
        ranges, start = [], lo
        while start < hi and total:
            a = start % total
            b = min(total, a + hi - start)
            ranges.append((a, b))
            start += b - a
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

    # Per chunk, never combine_chunks(): that copies the whole column even when it has one
    # chunk (a third of the read time for 784-float rows). Array columns are list<...> in
    # Parquet: flatten each level (vectorized, no Python loop per row), then reshape.
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    parts = []
    for arr in chunks:
        for _ in range(column.depth):
            arr = pc.list_flatten(arr)
        parts.append(arr.to_numpy(zero_copy_only=False))  # binary/string: bytes/str objects
    values = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return values.astype(column.dtype, copy=False).reshape((-1, *column.shape))


def read_piece(root: str, piece: Piece, columns: Sequence[Column]) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    path = os.path.join(root, piece.path)
    try:
        # One thread per file: the reader decodes several pieces at once instead (measured
        # faster on 2 cores than pyarrow's own threads inside one small file).
        table = pq.read_table(path, columns=[c.name for c in columns], use_threads=False)
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


#: A function over a piece's rows (``{column: array}``, any number of rows) applied in the
#: read-ahead threads: a TransformSpec decoding images or text (transform.apply).
Decode = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def _read_rows(
    root: str, piece: Piece, columns: Sequence[Column], perm: np.ndarray | None,
    decode: Decode | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """``read_piece``, rows in ``perm`` order (unchanged when ``perm`` is None), decoded."""
    chunk = read_piece(root, piece, columns)
    # np.take releases the GIL: the shuffle copy runs in the read-ahead thread too.
    rows = chunk if perm is None else {k: np.take(v, perm, axis=0) for k, v in chunk.items()}
    return rows if decode is None else decode(rows)


#: One planned piece: its epoch (pass), its index, its rows' order.
Planned = tuple[int, int, "np.ndarray | None"]


def _pieces_ahead(
    root: str,
    pieces: Sequence[Piece],
    plan: Iterable[tuple[int, np.ndarray | None]] | Iterable[Planned],
    columns: Sequence[Column],
    ahead: int = READ_AHEAD,
    decode: Decode | None = None,
) -> Generator[Any, None, None]:
    """The planned pieces, each read and permuted (and decoded), up to ``ahead`` of them in
    background threads (pyarrow, numpy and image decoders release the GIL) so the consumer
    rarely waits for the disk, the decoder or the shuffle. ``plan`` holds ``(index, perm)``
    (yields the rows) or :data:`Planned` items (yields ``(epoch, rows)``); the latter may
    run on over many passes, and the next pass's pieces are read while this one's last
    batches are consumed."""
    from concurrent.futures import Future, ThreadPoolExecutor

    pool = ThreadPoolExecutor(ahead, thread_name_prefix="hvdrunner-read")
    pending: collections.deque[tuple[Any, Future[dict[str, np.ndarray]]]] = collections.deque()

    def submit(item: Any) -> None:
        i, perm = item[-2:]
        pending.append((item, pool.submit(_read_rows, root, pieces[i], columns, perm, decode)))

    try:
        todo = iter(plan)
        for item in itertools.islice(todo, ahead):
            submit(item)
        while pending:
            item, future = pending.popleft()
            chunk = future.result()
            nxt = next(todo, None)
            if nxt is not None:
                submit(nxt)
            yield (item[0], chunk) if len(item) == 3 else chunk
    finally:  # the consumer stopped early (or failed): drop what is queued, keep no thread
        for _, f in pending:
            f.cancel()
        pool.shutdown(wait=True)


def _planned(
    lengths: Sequence[int], shuffle: bool, seed: int, shard: int, first_epoch: int,
    passes: int | None,
) -> Iterator[Planned]:  # fmt: skip
    """Every pass's plan, one after another (endless when ``passes`` is None)."""
    epoch = first_epoch
    while passes is None or epoch < first_epoch + passes:
        plan = pass_plan(lengths, shuffle, seed, shard, epoch)
        for i, perm in plan:
            yield epoch, i, perm
        epoch += 1


def pass_plan(
    lengths: Sequence[int], shuffle: bool, seed: int, shard: int, epoch: int
) -> list[tuple[int, np.ndarray | None]]:
    """One pass's order: ``(piece index, row permutation or None)`` per piece.

    The single source of the order for both the streaming and the in-memory feed, so the two
    give the same batches, and a job resumed at ``epoch`` sees what an uninterrupted one would.
    """
    rng = np.random.default_rng([seed, shard, epoch])
    order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    return [(i, rng.permutation(lengths[i]) if shuffle else None) for i in map(int, order)]


def epoch_indices(
    lengths: Sequence[int], batch_size: int, shuffle: bool, seed: int, shard: int, epoch: int
) -> np.ndarray:
    """Row indices (into the shard's pieces concatenated in order) of one pass, padded to
    whole batches from the pass's own first rows exactly as :func:`iter_batches` pads."""
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    parts = [
        offsets[i] + (perm if perm is not None else np.arange(lengths[i]))
        for i, perm in pass_plan(lengths, shuffle, seed, shard, epoch)
    ]
    idx = np.concatenate(parts).astype(np.int64)
    steps = math.ceil(len(idx) / batch_size)
    need = steps * batch_size - len(idx)
    if need:
        head = parts[0][:batch_size]
        idx = np.concatenate([idx, np.resize(head, need)])
    return idx


def iter_batches(
    root: str,
    pieces: Sequence[Piece],
    columns: Sequence[Column],
    batch_size: int,
    shuffle: bool,
    seed: int,
    shard: int,
    first_epoch: int = 0,
    read_ahead: int = READ_AHEAD,
    passes: int | None = None,
    pass_steps: int | None = None,
    decode: Decode | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Full batches over the shard, pieces decoded ahead in background threads.

    Each pass (epoch) is reshuffled with its own seed and padded to ``ceil(rows /
    batch_size)`` batches from the pass's own first rows. ``first_epoch``: the pass a
    resumed job starts at. ``read_ahead``: pieces decoded at once in background threads.
    ``passes``: ``None`` is endless; a number gives that many passes of ``pass_steps``
    batches with no padding, the last batch of each pass holding what is left (an
    evaluation that counts each row once: :func:`exact_steps`). ``decode``: applied to each
    piece's rows in the read-ahead threads, before they are batched (``read_ahead`` pieces
    decoded at once), as petastorm applies a transform to each row group.
    """
    lengths = [p.stop - p.start for p in pieces]
    steps = math.ceil(sum(lengths) / batch_size) if pass_steps is None else pass_steps
    if not sum(lengths):
        return
    plan = _planned(lengths, shuffle, seed, shard, first_epoch, passes)
    with contextlib.closing(
        _pieces_ahead(root, pieces, plan, columns, read_ahead, decode)
    ) as stream:
        for _, chunks in itertools.groupby(stream, key=lambda item: item[0]):
            rows = (chunk for _, chunk in chunks)
            if passes is None:
                yield from _padded_pass(rows, batch_size, steps)
            else:
                yield from _exact_pass(rows, batch_size, steps)


def _rows(arrays: dict[str, np.ndarray]) -> int:
    return len(next(iter(arrays.values())))


def _padded_pass(
    chunks: Iterator[dict[str, np.ndarray]], batch_size: int, steps: int
) -> Iterator[dict[str, np.ndarray]]:
    """``steps`` full batches of one pass, the last topped up from the pass's first rows."""
    emitted = 0
    carry: dict[str, np.ndarray] | None = None  # < batch_size rows left from the last piece
    head: dict[str, np.ndarray] | None = None  # first rows of the pass, for padding
    for chunk in chunks:
        if head is None:
            head = {k: v[:batch_size] for k, v in chunk.items()}
        start = 0
        if carry is not None:  # top the carry up to one batch: a small copy only
            take = min(batch_size - _rows(carry), _rows(chunk))
            carry = {k: np.concatenate([carry[k], v[:take]]) for k, v in chunk.items()}
            start = take
            if _rows(carry) == batch_size:
                yield carry
                emitted += 1
                carry = None
        n = _rows(chunk)
        full = start + (n - start) // batch_size * batch_size
        for lo in range(start, full, batch_size):  # views into the piece, no copy
            yield {k: v[lo : lo + batch_size] for k, v in chunk.items()}
            emitted += 1
        if full < n:
            rest = {k: v[full:] for k, v in chunk.items()}
            carry = rest if carry is None else {
                k: np.concatenate([carry[k], rest[k]]) for k in rest
            }  # fmt: skip
    if emitted < steps:  # pad the last partial batch from the pass's own first rows
        assert carry is not None and head is not None
        need = batch_size - _rows(carry)
        pad = {k: np.resize(v, (need, *v.shape[1:])) for k, v in head.items()}
        yield {k: np.concatenate([carry[k], pad[k]]) for k in carry}


def _exact_pass(
    chunks: Iterator[dict[str, np.ndarray]], batch_size: int, steps: int
) -> Iterator[dict[str, np.ndarray]]:
    """``steps`` batches of one pass: full ones, then everything left as the last."""
    left: dict[str, np.ndarray] | None = None  # rows not yet in a batch
    emitted = 0
    for chunk in chunks:
        left = (
            chunk if left is None else {k: np.concatenate([left[k], v]) for k, v in chunk.items()}
        )
        n, start = len(next(iter(left.values()))), 0
        while emitted < steps - 1 and n - start >= batch_size:  # views, no copy
            yield {k: v[start : start + batch_size] for k, v in left.items()}
            start += batch_size
            emitted += 1
        left = {k: v[start:] for k, v in left.items()}
    if left is not None and len(next(iter(left.values()))):
        yield left


def load_shard(
    root: str, pieces: Sequence[Piece], columns: Sequence[Column], read_ahead: int = READ_AHEAD
) -> dict[str, np.ndarray]:
    """The whole shard in memory, pieces in order (the in-memory feed): each piece is
    decoded (in read-ahead threads) and copied once into preallocated arrays."""
    lengths = [p.stop - p.start for p in pieces]
    out = {
        c.name: np.empty((sum(lengths), *c.shape), dtype=c.dtype)
        for c in columns
    }  # fmt: skip
    offset = 0
    plan = [(i, None) for i in range(len(pieces))]
    with contextlib.closing(_pieces_ahead(root, pieces, plan, columns, read_ahead)) as chunks:
        for n, chunk in zip(lengths, chunks, strict=True):
            for k, v in chunk.items():
                out[k][offset : offset + n] = v
            offset += n
    return out
