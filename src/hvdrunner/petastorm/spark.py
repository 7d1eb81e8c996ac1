"""``make_spark_converter`` and ``SparkDatasetConverter`` as ``petastorm.spark`` has them, on
hvdrunner's data layer: equal shards, the input-keyed cache, integrity checks.

Example:
    >>> from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter
    >>> spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF,  # doctest: +SKIP
    ...                "file:///dbfs/tmp/petastorm/cache")
    >>> converter = make_spark_converter(df)  # doctest: +SKIP
    >>> with converter.make_tf_dataset(batch_size=64, cur_shard=hvd.rank(),  # doctest: +SKIP
    ...                                shard_count=hvd.size()) as ds:
    ...     ds = ds.map(lambda x: (x.features, x.label))
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from hvdrunner._checks import is_int
from hvdrunner.data import PreparedData, prepare
from hvdrunner.petastorm.options import read_options

PARENT_CACHE_DIR_URL_CONF = "petastorm.spark.converter.parentCacheDirUrl"
DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024  # petastorm's default
_CODECS = ("uncompressed", "bzip2", "gzip", "lz4", "snappy", "deflate")  # petastorm's list


class SparkDatasetConverter:
    """One DataFrame written as Parquet, read as a ``tf.data.Dataset`` or a torch loader.

    Picklable and small (it holds where the files are, never data): pass it to the function
    ``HorovodRunner.run`` runs. Made by :func:`make_spark_converter`.

    Example:
        >>> len(converter)  # rows  # doctest: +SKIP
        1797
    """

    PARENT_CACHE_DIR_URL_CONF = PARENT_CACHE_DIR_URL_CONF

    def __init__(self, data: PreparedData) -> None:
        self._data = data
        self._deleted = False

    def _check_alive(self) -> None:
        if self._deleted:
            raise ValueError(
                "this converter's files were deleted (converter.delete()): make a new one with "
                "make_spark_converter(df)"
            )

    @property
    def cache_dir_url(self) -> str:
        return self._data.spark_url

    @property
    def file_urls(self) -> list[str]:
        return [f"{self._data.spark_url.rstrip('/')}/{name}" for name, _ in self._data.files]

    @property
    def dataset_size(self) -> int:
        return self._data.num_rows

    def __len__(self) -> int:
        return self._data.num_rows

    def make_tf_dataset(
        self,
        batch_size: int | None = None,
        prefetch: int | None = None,
        num_epochs: int | None = None,
        workers_count: int | None = None,
        shuffling_queue_capacity: int | None = None,
        **petastorm_reader_kwargs: Any,
    ) -> contextlib.AbstractContextManager[Any]:
        """A context manager yielding a ``tf.data.Dataset`` of batches: namedtuples with a
        field per column (as petastorm's), every batch full.

        ``num_epochs=None`` is endless, full batches, the same number on every shard (each
        pass is ``ceil(ceil(N / shard_count) / batch_size)`` batches; a pass's last batch is
        topped up with its own first rows, and a shard smaller than a batch is repeated to
        fill it): for training. A number gives that many passes in which every row counts
        once over the shards, the last batch of a pass what is left, as petastorm's (shards
        may then differ by a batch): for evaluation. ``transform_spec``: a
        :class:`~hvdrunner.petastorm.TransformSpec` that decodes each batch on the rank
        (images, text), ``workers_count`` batches at once in threads.
        ``workers_count``: pieces decoded at once. Any shuffle asked for (the default
        ``shuffle_row_groups=True``, ``shuffle_rows``, a ``shuffling_queue_capacity``) is a full
        per-epoch permutation of the shard, reproducible from ``seed`` (``None``: 0).

        Example:
            >>> with converter.make_tf_dataset(batch_size=32, cur_shard=hvd.rank(),  # doctest: +SKIP
            ...                                shard_count=hvd.size()) as ds:
            ...     model.fit(ds.map(lambda x: (x.features, x.label)), steps_per_epoch=10)
        """
        from hvdrunner.petastorm.tf_dataset import tf_dataset

        self._check_alive()
        opts = read_options(self._names(), batch_size, num_epochs, workers_count,
                            shuffling_queue_capacity, petastorm_reader_kwargs)  # fmt: skip
        if prefetch is not None and not is_int(prefetch):
            raise ValueError(f"prefetch={prefetch!r} must be an int, or None for autotune")
        return tf_dataset(self._data, opts, prefetch)

    def make_torch_dataloader(
        self,
        batch_size: int = 32,
        num_epochs: int | None = None,
        workers_count: int | None = None,
        shuffling_queue_capacity: int = 0,
        data_loader_fn: Any = None,
        **petastorm_reader_kwargs: Any,
    ) -> contextlib.AbstractContextManager[Any]:
        """A context manager yielding a loader whose iteration gives ``{column: tensor}``
        batches (as petastorm's ``DataLoader``). Arguments as in :meth:`make_tf_dataset`; a
        new ``iter(loader)`` starts a new pass, with the next epochs' shuffle order.

        Example:
            >>> with converter.make_torch_dataloader(batch_size=32, cur_shard=hvd.rank(),  # doctest: +SKIP
            ...                                      shard_count=hvd.size()) as loader:
            ...     batch = next(iter(loader))  # {"features": tensor, "label": tensor}
        """
        if data_loader_fn is not None:
            raise ValueError(
                "data_loader_fn= is not offered: the loader is hvdrunner's (equal batches per "
                "rank); drop it, and wrap the batches it yields if you need more"
            )
        from hvdrunner.petastorm.torch_loader import torch_dataloader

        self._check_alive()
        opts = read_options(self._names(), batch_size, num_epochs, workers_count,
                            shuffling_queue_capacity, petastorm_reader_kwargs)  # fmt: skip
        return torch_dataloader(self._data, opts)

    def delete(self) -> None:
        """Remove the cached files (on the driver, after training; safe to call twice)."""
        self._data.delete()
        self._deleted = True

    def prepared(self, features: str, label: str | None = None) -> PreparedData:
        """The same files as :class:`hvdrunner.data.PreparedData` feeding ``features`` (and
        ``label``): what ``hvdrunner.keras.fit(data=converter, features=..., label=...)`` reads.

        Example:
            >>> converter.prepared("features", "label").steps_per_epoch(32, 2)  # doctest: +SKIP
            29
        """
        self._check_alive()
        if not isinstance(features, str) or not (label is None or isinstance(label, str)):
            raise ValueError(f"features={features!r}, label={label!r}: pass one column name each")
        names = [features, *([label] if label is not None else [])]
        unknown = [n for n in names if n not in self._names()]
        if unknown:
            raise ValueError(
                f"features/label name {unknown}, not columns of the converted DataFrame "
                f"{self._names()}"
            )
        columns = tuple(c for c in self._data.columns if c.name in names)
        return dataclasses.replace(self._data, columns=columns, features=(features,),
                                   label=label, single_feature=True)  # fmt: skip

    def _names(self) -> list[str]:
        return [c.name for c in self._data.columns]


def make_spark_converter(
    df: Any,
    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
    compression_codec: str | None = None,
    dtype: str | None = "float32",
    *,
    shared: bool = False,
) -> SparkDatasetConverter:
    """Write ``df`` (every column) as Parquet under the Spark conf
    ``petastorm.spark.converter.parentCacheDirUrl``; return its converter.

    As petastorm's: ``df`` may be a DataFrame or the path of a Parquet directory;
    ``dtype`` (``"float32"``, ``"float64"`` or ``None`` to keep each column's) casts floating
    columns and ML vectors; ``compression_codec`` (default ``None``: uncompressed) and
    ``parquet_row_group_size_bytes`` set how the files are stored. Unlike petastorm's, the
    cache outlives the Python process and is reused only while the input is unchanged (its
    key covers the plan and every input file); ``delete()`` removes it. ``shared=True``
    declares a non-Databricks shared mount (NFS) for a multi-node cluster, as in
    :func:`hvdrunner.data.prepare`.

    Raises:
        ValueError: the conf is not set; an unknown codec or dtype; a column that cannot be a
            tensor (maps, structs: named, with the fix); nulls; ragged arrays; an empty
            DataFrame.

    Example:
        >>> converter = make_spark_converter(df, compression_codec="snappy")  # doctest: +SKIP
    """
    if isinstance(df, str):
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is None:
            raise RuntimeError("make_spark_converter(path) needs an active SparkSession")
        df = session.read.parquet(df)
    parent = df.sparkSession.conf.get(PARENT_CACHE_DIR_URL_CONF, None)
    if not parent:
        raise ValueError(
            f"Please set the spark config {PARENT_CACHE_DIR_URL_CONF}: "
            f"spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "
            f"'file:///dbfs/tmp/petastorm/cache') (a /Volumes/... path or a local directory "
            f"work too)"
        )
    codec = compression_codec or "uncompressed"  # petastorm's default
    if not isinstance(codec, str) or codec.lower() not in _CODECS:
        raise ValueError(
            f"compression_codec={compression_codec!r}: pass None or one of {list(_CODECS)}"
        )
    data = prepare(
        df, features=list(df.columns), cache_dir=parent, dtype=dtype, compression=codec,
        row_group_bytes=parquet_row_group_size_bytes, shared=shared,
    )  # fmt: skip
    return SparkDatasetConverter(data)


__all__ = [
    "DEFAULT_ROW_GROUP_SIZE_BYTES",
    "PARENT_CACHE_DIR_URL_CONF",
    "SparkDatasetConverter",
    "make_spark_converter",
]
