"""Spark DataFrame → Parquet on shared storage → each rank's equal, endless input stream.

Example:
    >>> from hvdrunner.data import prepare
    >>> data = prepare(df, cache_dir="/dbfs/tmp/hvd-cache", features="pixels", label="label")  # doctest: +SKIP
    >>> def train():
    ...     import horovod.tensorflow.keras as hvd; hvd.init()
    ...     with data.tf_dataset(batch_size=64) as ds:        # this rank's shard, endless
    ...         model.fit(ds, steps_per_epoch=data.steps_per_epoch(64), epochs=5)

How shards stay equal: ``prepare`` writes plain Parquet (one directory per DataFrame,
files of at most ``rows_per_file`` rows) and records each file's row count. A rank does not
pick files or row groups (Petastorm's sharding, which gives unequal shards); it takes its
contiguous range of ``ceil(N / np)`` global rows, the last rank wrapping around to the first
rows. So any ``np`` with ``batch_size * np <= N`` gets identical step counts.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdrunner._data_reader import Column, iter_batches, rows_per_rank, shard_pieces
from hvdrunner.distributed import rank, size

DEFAULT_CACHE_DIR = os.path.join(os.getcwd(), ".hvdrunner", "data-cache")
_META = "_hvdrunner_meta.json"
_FORMAT = 1


@dataclass(frozen=True)
class PreparedData:
    """A picklable handle on prepared Parquet: locations, row counts, schema. Small by design."""

    spark_url: str
    local_path: str
    files: tuple[tuple[str, int], ...]
    num_rows: int
    columns: tuple[Column, ...]
    features: tuple[str, ...]
    label: str | None
    single_feature: bool = field(default=True)

    # -- sizes -----------------------------------------------------------------------------
    def rows_per_rank(self, num_ranks: int | None = None) -> int:
        """Rows each rank reads per epoch (before padding to whole batches)."""
        return rows_per_rank(self.num_rows, num_ranks or size())

    def steps_per_epoch(self, batch_size: int, num_ranks: int | None = None) -> int:
        """Batches per epoch: identical on every rank. ``num_ranks`` defaults to the job's size.

        Raises:
            ValueError: when ``batch_size`` exceeds one rank's share of the rows.
        """
        n = num_ranks or size()
        per = self.rows_per_rank(n)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size > per:
            raise ValueError(
                f"batch_size={batch_size} is larger than one rank's shard ({per} of "
                f"{self.num_rows} rows over {n} ranks). Use batch_size<={per} or fewer ranks."
            )
        return math.ceil(per / batch_size)

    # -- reading ---------------------------------------------------------------------------
    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        first_epoch: int = 0,
    ) -> Iterator[dict[str, Any]]:
        """Endless numpy batches ``{column: array}`` of this rank's shard (framework-free).

        ``first_epoch`` (e.g. Keras' ``initial_epoch`` after a resume) picks up the per-epoch
        shuffle order where an uninterrupted run would be.
        """
        shard = rank() if cur_shard is None else cur_shard
        count = size() if shard_count is None else shard_count
        if not 0 <= shard < count:
            raise ValueError(f"cur_shard={shard} must be in [0, shard_count={count})")
        self.steps_per_epoch(batch_size, count)
        pieces = shard_pieces(self.files, shard, count)
        return iter_batches(
            self.local_path, pieces, self.columns, batch_size, shuffle, seed, shard, first_epoch
        )

    @contextlib.contextmanager
    def tf_dataset(
        self,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        prefetch: int = 2,
        first_epoch: int = 0,
    ) -> Iterator[Any]:
        """This rank's shard as an endless ``tf.data.Dataset`` of full batches.

        Yields ``(features, label)`` (``features`` is an array, or a dict when several
        feature columns were prepared), or ``features`` alone without a label. ``transform``
        maps each numpy batch ``{column: array}`` to a new dict before it becomes tensors.
        Shard index and count come from Horovod (``HOROVOD_RANK``/``HOROVOD_SIZE``) unless
        given. ``first_epoch``: as in :meth:`batches`.
        """
        import tensorflow as tf

        def gen() -> Iterator[Any]:
            for batch in self.batches(
                batch_size,
                shuffle=shuffle,
                seed=seed,
                cur_shard=cur_shard,
                shard_count=shard_count,
                first_epoch=first_epoch,
            ):
                yield self._structure(transform(batch) if transform else batch)

        sample = next(gen())
        signature = tf.nest.map_structure(
            lambda a: tf.TensorSpec(shape=a.shape, dtype=tf.as_dtype(a.dtype)), sample
        )
        ds = tf.data.Dataset.from_generator(gen, output_signature=signature).prefetch(prefetch)
        try:
            yield ds
        finally:
            # Pieces are opened, read and closed one at a time: no reader outlives the block.
            del ds

    def _structure(self, batch: dict[str, Any]) -> Any:
        x = batch[self.features[0]] if self.single_feature else {f: batch[f] for f in self.features}
        return x if self.label is None else (x, batch[self.label])

    # -- lifecycle -------------------------------------------------------------------------
    def delete(self) -> None:
        """Remove the prepared files (rank 0 or the driver; safe to call twice)."""
        shutil.rmtree(self.local_path, ignore_errors=True)


def prepare(
    df: Any,
    *,
    features: str | Sequence[str],
    label: str | None = None,
    cache_dir: str | None = None,
    dtype: str = "float32",
    shapes: dict[str, Sequence[int]] | None = None,
    rows_per_file: int | None = None,
) -> PreparedData:
    """Write ``df``'s feature/label columns as Parquet under ``cache_dir``; return the handle.

    Runs on the driver, before ``HorovodRunner.run``. Calling it again on the same
    DataFrame reuses the files; ``data.delete()`` removes them.

    Args:
        df: a Spark DataFrame (e.g. a Delta table).
        features: one column (fed as one tensor) or several (fed as a dict of tensors).
            Numeric scalars, arrays of numbers (fixed length) and ML vectors are supported.
        label: the label column, or ``None`` for unlabelled input.
        cache_dir: ``dbfs:/…``, ``/dbfs/…``, ``/Volumes/…`` on Databricks (shared by all
            nodes), a local directory locally. Default: ``./.hvdrunner/data-cache``.
        dtype: floating columns are cast to this (``float32`` is what Keras wants).
        shapes: per-row shape of array columns, e.g. ``{"pixels": (28, 28)}`` for a flat
            784-long array; default: the array's length.
        rows_per_file: rows per Parquet file; default sized for ~16 MB files.

    Raises:
        ValueError: empty DataFrame, unknown or unsupported column, ragged arrays,
            unusable cache dir.
        RuntimeError: called inside a Spark task or a Horovod rank.
    """
    from hvdrunner._data_prepare import materialize

    return materialize(
        df, features, label, cache_dir or DEFAULT_CACHE_DIR, dtype, shapes or {}, rows_per_file
    )


__all__ = ["DEFAULT_CACHE_DIR", "PreparedData", "prepare"]
