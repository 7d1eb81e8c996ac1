"""Spark DataFrame → Parquet on shared storage → each rank's equal, endless input stream.

- ``prepare`` (driver): validate columns, write Parquet atomically, reuse it while the input
  is unchanged. Returns a :class:`PreparedData`.
- ``handle``: :class:`PreparedData`, a small picklable handle ranks read from.
- ``reader`` (ranks): equal contiguous row ranges per rank, vectorized decode, seeded shuffle.
- ``transform`` (ranks): petastorm's :class:`TransformSpec`, decoding each batch (images,
  text) in threads ahead of the model, checked against the columns it declares.

Example:
    >>> from hvdrunner.data import prepare
    >>> data = prepare(df, cache_dir="/Volumes/<catalog>/<schema>/hvdrunner/cache", features="pixels", label="label")  # doctest: +SKIP
    >>> def train():
    ...     import hvdrunner.hvd_keras as hvd; hvd.init()
    ...     with data.tf_dataset(batch_size=64) as ds:        # this rank's shard, endless
    ...         model.fit(ds, steps_per_epoch=data.steps_per_epoch(64), epochs=5)

How shards stay equal: ``prepare`` writes plain Parquet (one directory per DataFrame,
files of at most ``rows_per_file`` rows) and records each file's row count. A rank does not
pick files or row groups (Petastorm's sharding, which gives unequal shards); it takes its
contiguous range of ``ceil(N / np)`` global rows, the last rank wrapping around to the first
rows. So any ``np`` with ``batch_size * np <= N`` gets identical step counts.
"""

from hvdrunner.data.handle import PreparedData, default_cache_dir
from hvdrunner.data.prepare import prepare
from hvdrunner.data.transform import TransformSpec

__all__ = ["PreparedData", "TransformSpec", "default_cache_dir", "prepare"]
