"""``PreparedData``: the small picklable handle ``prepare`` returns, and how ranks read it.

Ranks read only through this handle: it holds URLs, row counts and the schema, never data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdrunner._checks import is_int
from hvdrunner._logging import get_logger
from hvdrunner.data import tf_feed
from hvdrunner.data import transform as transforms
from hvdrunner.data.reader import (
    READ_AHEAD,
    Column,
    Piece,
    epoch_indices,
    exact_steps,
    iter_batches,
    load_shard,
    rows_per_rank,
    shard_pieces,
)
from hvdrunner.data.transform import TransformSpec, map_ahead
from hvdrunner.distributed import local_size, rank, size


def default_cache_dir() -> str:
    """``prepare()``'s default ``cache_dir``: ``./.hvdrunner/data-cache`` of the working
    directory when it is called (not when hvdrunner was imported)."""
    return os.path.join(os.getcwd(), ".hvdrunner", "data-cache")


_META = "_hvdrunner_meta.json"
_log = get_logger("hvdrunner.data")
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
    read_ahead: int = field(default=READ_AHEAD)  # pieces decoded at once (threads) by a rank
    # Applied to every batch on the ranks (decoding images, text): a TransformSpec.
    transform: TransformSpec | None = field(default=None)
    workers: int = field(default=READ_AHEAD)  # batches transformed at once (threads)

    def transformed(
        self, spec: TransformSpec, features: str | list[str], label: str | None = None,
        workers: int | None = None,
    ) -> PreparedData:  # fmt: skip
        """This data decoded on the ranks by ``spec`` (petastorm's ``TransformSpec``), fed as
        ``features`` (and ``label``): columns of the transform's output.

        Raises:
            ValueError: ``features``/``label`` are not columns the transform makes.

        Example:
            >>> images = data.transformed(spec, "features", "label_index")  # doctest: +SKIP
        """
        feats = transforms.fed_columns(spec, features, label, [c.name for c in self.columns])
        if workers is not None and not is_int(workers, at_least=1):
            raise ValueError(f"workers={workers!r} must be an int >= 1 (batches decoded at once)")
        return dataclasses.replace(
            self, transform=spec, features=feats, label=label,
            single_feature=isinstance(features, str), workers=workers or self.workers,
        )  # fmt: skip

    # -- sizes -----------------------------------------------------------------------------
    def rows_per_rank(self, num_ranks: int | None = None) -> int:
        """Rows each rank reads per epoch (before padding to whole batches)."""
        return rows_per_rank(self.num_rows, num_ranks or size())

    def steps_per_epoch(
        self, batch_size: int, num_ranks: int | None = None, strict: bool = True
    ) -> int:
        """Batches per epoch: identical on every rank. ``num_ranks`` defaults to the job's size.

        Raises:
            ValueError: when ``batch_size`` exceeds one rank's share of the rows (unless not
                ``strict``: then one batch, topped up by repeating the shard, as petastorm
                gives a small shard).
        """
        n = num_ranks or size()
        per = self.rows_per_rank(n)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size > per and strict:
            raise ValueError(
                f"batch_size={batch_size} is larger than one rank's shard ({per} of "
                f"{self.num_rows} rows over {n} ranks). Use batch_size<={per} or fewer ranks."
            )
        return math.ceil(per / batch_size)

    # -- reading ---------------------------------------------------------------------------
    def _shard(
        self, batch_size: int, cur_shard: int | None, shard_count: int | None,
        strict: bool = True, wrap: bool = True,
    ) -> tuple[int, int, list[Piece]]:  # fmt: skip
        shard = rank() if cur_shard is None else cur_shard
        count = size() if shard_count is None else shard_count
        if not 0 <= shard < count:
            raise ValueError(f"cur_shard={shard} must be in [0, shard_count={count})")
        self.steps_per_epoch(batch_size, count, strict)
        pieces = shard_pieces(self.files, shard, count, wrap)
        self._check_visible({p.path for p in pieces})
        return shard, count, pieces

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        first_epoch: int = 0,
        in_memory: bool | None = None,
        passes: int | None = None,
        strict: bool = True,
    ) -> Iterator[dict[str, Any]]:
        """Endless numpy batches ``{column: array}`` of this rank's shard (framework-free),
        decoded by :attr:`transform` when there is one (``workers`` batches at once).

        ``first_epoch`` (e.g. Keras' ``initial_epoch`` after a resume) picks up the per-epoch
        shuffle order where an uninterrupted run would be. ``in_memory``: decode the shard
        once and gather each batch from memory (``None``: when :meth:`shard_bytes` fits the
        budget, as in :meth:`tf_dataset`); both give the same batches. ``passes``: that many
        passes, then the end, each counting every row of the data once over the shards (no
        padding, no wrap-around), with the same number of batches on every shard, the last
        one holding what is left (:func:`~hvdrunner.data.reader.exact_steps`): an
        evaluation pass. ``strict=False``: a batch larger than the
        shard is topped up by repeating it instead of refused (the petastorm drop-in).
        """
        count = size() if shard_count is None else shard_count
        exact = None if passes is None else exact_steps(self.num_rows, count, batch_size)
        if passes is not None and exact is None:
            _log.warning(
                f"{self.num_rows} rows cannot give {count} shards a batch each: this pass "
                f"repeats rows to fill the shards (fewer shards count every row once)"
            )
        shard, count, pieces = self._shard(batch_size, cur_shard, shard_count, strict,
                                           wrap=exact is None)  # fmt: skip
        if in_memory is None:  # a transform decodes pieces as they stream (see below)
            in_memory = self.transform is None and self.shard_bytes(count) <= _memory_budget()
        decode = (
            None if self.transform is None else functools.partial(transforms.apply, self.transform)
        )
        if in_memory and passes is None:
            feed = self._memory_batches(pieces, batch_size, shuffle, seed, shard, first_epoch)
            # Decoded batch by batch: what is held in memory stays the small source bytes.
            return feed if decode is None else map_ahead(decode, feed, self.workers)
        # Streamed: each piece decoded whole in the read-ahead threads (``workers`` at once)
        # before it is batched, as petastorm decodes a row group: fewer, larger calls. Fields
        # of variable length cannot be: decoded pieces of different widths do not join into
        # batches, so each batch is decoded alone (one width per batch).
        variable = self.transform is not None and bool(self.transform.variable_axes())
        per_batch, per_piece = (decode, None) if variable else (None, decode)
        feed = iter_batches(
            self.local_path, pieces, self.columns, batch_size, shuffle, seed, shard,
            first_epoch, self.workers if per_piece else self.read_ahead, passes, exact, per_piece,
        )  # fmt: skip
        return feed if per_batch is None else map_ahead(per_batch, feed, self.workers)

    def _memory_batches(
        self, pieces: list[Piece], batch_size: int, shuffle: bool, seed: int, shard: int,
        first_epoch: int,
    ) -> Iterator[dict[str, Any]]:  # fmt: skip
        lengths = [p.stop - p.start for p in pieces]
        arrays = load_shard(self.local_path, pieces, self.columns, self.read_ahead)
        epoch = first_epoch
        while True:
            idx = epoch_indices(lengths, batch_size, shuffle, seed, shard, epoch)
            for lo in range(0, len(idx), batch_size):
                rows = idx[lo : lo + batch_size]
                yield {k: v[rows] for k, v in arrays.items()}  # a fresh, writable copy
            epoch += 1

    def shard_bytes(self, num_ranks: int | None = None) -> int:
        """Decoded size of one rank's shard in memory (what ``in_memory=True`` holds; binary
        and string columns at the size of the files)."""
        row = sum(np.dtype(c.dtype).itemsize * math.prod(c.shape)
                  for c in self.columns if c.dtype != "object")  # fmt: skip
        objects = 0
        if any(c.dtype == "object" for c in self.columns):
            on_disk = sum(os.path.getsize(os.path.join(self.local_path, p)) for p, _ in self.files
                          if os.path.exists(os.path.join(self.local_path, p)))  # fmt: skip
            objects = on_disk // max(1, self.num_rows)
        return self.rows_per_rank(num_ranks) * (row + objects)

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
        in_memory: bool | None = None,
        passes: int | None = None,
        strict: bool = True,
    ) -> Iterator[Any]:
        """This rank's shard as an endless ``tf.data.Dataset`` of full batches.

        Yields ``(features, label)`` (``features`` is an array, or a dict when several
        feature columns were prepared), or ``features`` alone without a label. ``transform``
        maps each numpy batch ``{column: array}`` to a new dict before it becomes tensors.
        Shard index and count come from Horovod (``HOROVOD_RANK``/``HOROVOD_SIZE``) unless
        given. ``first_epoch``, ``passes``, ``strict``: as in :meth:`batches`; with
        :attr:`transform` or ``passes`` the batches come through :meth:`batches`.

        ``in_memory``: decode the shard once and keep it in memory; each epoch then only
        gathers rows in the epoch's order (no re-decode): what Keras does with numpy arrays. ``None`` (default) does so when there is no
        ``transform`` and :meth:`shard_bytes` fits the budget (a quarter of this machine's
        memory shared by its local ranks, at most 4 GiB); otherwise pieces are streamed from
        disk, decoded ahead in background threads. Both give the same batches.

        Example:
            >>> with data.tf_dataset(64) as ds:  # doctest: +SKIP
            ...     model.fit(ds, steps_per_epoch=data.steps_per_epoch(64), epochs=5)
        """
        through_python = transform is not None or self.transform is not None or passes is not None
        if in_memory and through_python:
            raise ValueError(
                "in_memory=True feeds with TensorFlow ops and cannot call a numpy transform or "
                "end after passes; drop transform= (do it in the model or a ds.map) or pass "
                "in_memory=False"
            )
        if through_python:

            def feed() -> Iterator[Any]:
                # Streamed: a decode or an exact pass goes through Python batch by batch.
                batches = self.batches(
                    batch_size, shuffle=shuffle, seed=seed, cur_shard=cur_shard,
                    shard_count=shard_count, first_epoch=first_epoch, in_memory=False,
                    passes=passes, strict=strict,
                )  # fmt: skip
                return batches if transform is None else map(transform, batches)

            variable = self.transform.variable_axes() if self.transform is not None else {}
            ds = tf_feed.generator_dataset(feed, self.structure, partial=passes is not None,
                                           variable=variable)  # fmt: skip
        else:
            shard, count, pieces = self._shard(batch_size, cur_shard, shard_count, strict)
            if in_memory is None:
                in_memory = self.shard_bytes(count) <= _memory_budget()
            args = (self, pieces, batch_size, shuffle, seed, shard, first_epoch)
            ds = tf_feed.memory_dataset(*args) if in_memory else tf_feed.stream_dataset(*args)
        ds = ds.prefetch(prefetch)
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
                f"with prepare(..., shared=True)); if it was deleted, run prepare() again (or "
                f"make_spark_converter(df) for a petastorm converter)."
            )

    def structure(self, batch: dict[str, Any]) -> Any:
        """A ``{column: array}`` batch as the model is fed (:func:`~hvdrunner.data.transform.as_fed`)."""
        return transforms.as_fed(batch, self.features, self.label, self.single_feature)

    # -- lifecycle -------------------------------------------------------------------------
    def delete(self) -> None:
        """Remove the prepared files (rank 0 or the driver; safe to call twice)."""
        shutil.rmtree(self.local_path, ignore_errors=True)


def _memory_budget() -> int:
    """Bytes one rank may hold for ``in_memory``: a quarter of RAM over the local ranks, <= 4 GiB."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not POSIX: stream
        return 0
    local = max(1, local_size())
    return min(4 << 30, total // (4 * local))


__all__ = ["PreparedData", "default_cache_dir"]


def prepared_behind(data: Any, features: str | None, label: str | None) -> PreparedData | None:
    """The :class:`PreparedData` an input stands for: itself, or what a converter over
    prepared files (:mod:`hvdrunner.petastorm`'s) names with ``prepared(features, label)``
    (its column names checked there); None for anything else (a real Petastorm converter).
    The adapters read converters through this, never through the converter's module.

    Example:
        >>> prepared_behind(converter, "features", "label").num_rows  # doctest: +SKIP
        1437
    """
    if isinstance(data, PreparedData):
        return data
    prepared = getattr(data, "prepared", None)
    return prepared(features or "", label) if callable(prepared) else None
