"""``PreparedData``: the small picklable handle ``prepare`` returns, and how ranks read it.

Ranks read only through this handle: it holds URLs, row counts and the schema, never data.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hvdrunner.data.reader import Column, iter_batches, rows_per_rank, shard_pieces
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
    shared: bool = field(default=False)  # declared shared (prepare(shared=True)) or DBFS/Volumes

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
        self._check_visible({p.path for p in pieces})
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

    def _check_visible(self, names: set[str]) -> None:
        """Fail fast, naming the path, when this node cannot see the prepared files."""
        import socket

        missing = sorted(n for n in names if not os.path.isfile(os.path.join(self.local_path, n)))
        if missing:
            raise RuntimeError(
                f"rank {rank()} on host {socket.gethostname()} cannot see the prepared data at "
                f"{self.local_path} ({len(missing)} of its {len(names)} files missing, e.g. "
                f"{missing[0]}). cache_dir must be storage that every node mounts at the same "
                f"path (DBFS or /Volumes on Databricks; NFS or a FUSE-mounted bucket elsewhere, "
                f"with prepare(..., shared=True)); if it was deleted, run prepare() again."
            )

    def _structure(self, batch: dict[str, Any]) -> Any:
        x = batch[self.features[0]] if self.single_feature else {f: batch[f] for f in self.features}
        return x if self.label is None else (x, batch[self.label])

    # -- lifecycle -------------------------------------------------------------------------
    def delete(self) -> None:
        """Remove the prepared files (rank 0 or the driver; safe to call twice)."""
        shutil.rmtree(self.local_path, ignore_errors=True)


__all__ = ["DEFAULT_CACHE_DIR", "PreparedData"]
