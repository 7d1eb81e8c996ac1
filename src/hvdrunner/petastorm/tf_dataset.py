"""``make_tf_dataset``'s dataset: the shard as :meth:`PreparedData.tf_dataset` feeds it, each
batch a namedtuple of the columns (petastorm's element type), ``num_epochs`` passes or endless."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

from hvdrunner.data import PreparedData
from hvdrunner.petastorm.options import ReadOptions, batches_per_pass, view


@contextlib.contextmanager
def tf_dataset(data: PreparedData, opts: ReadOptions, prefetch: int | None) -> Iterator[Any]:
    """The ``tf.data.Dataset`` of namedtuple batches for :meth:`make_tf_dataset`.

    Example:
        >>> with tf_dataset(data, opts, None) as ds:  # doctest: +SKIP
        ...     next(iter(ds)).features.shape
        TensorShape([32, 64])
    """
    import tensorflow as tf

    bad = [n for n in opts.fields if not n.isidentifier()]
    if bad:
        raise ValueError(
            f"columns {bad} are not Python identifiers, so they cannot be namedtuple fields "
            f"(petastorm's batches are namedtuples): rename them in Spark first "
            f"(df.withColumnRenamed), or read them with make_torch_dataloader (dicts)"
        )
    row = collections.namedtuple("inferred_schema_view", opts.fields)  # type: ignore[misc]
    data = view(data, opts)
    with data.tf_dataset(
        opts.batch_size, shuffle=opts.shuffle, seed=opts.seed, cur_shard=opts.cur_shard,
        shard_count=opts.shard_count, prefetch=tf.data.AUTOTUNE if prefetch is None else prefetch,
    ) as ds:  # fmt: skip
        ds = ds.map(lambda batch: row(**batch))
        total = batches_per_pass(data, opts)
        yield ds if total is None else ds.take(total)


__all__ = ["tf_dataset"]
