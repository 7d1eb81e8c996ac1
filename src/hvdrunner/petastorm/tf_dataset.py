"""``make_tf_dataset``'s dataset: the shard as :meth:`PreparedData.tf_dataset` feeds it, each
batch a namedtuple of the columns (petastorm's element type), decoded by a ``TransformSpec``
when one is given; endless, or ``num_epochs`` passes that count every row once."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

from hvdrunner.data import PreparedData
from hvdrunner.petastorm.options import ReadOptions, view


@contextlib.contextmanager
def tf_dataset(data: PreparedData, opts: ReadOptions, prefetch: int | None) -> Iterator[Any]:
    """The ``tf.data.Dataset`` of namedtuple batches for :meth:`make_tf_dataset`.

    Endless (``num_epochs=None``): full batches, the same number on every shard (a shard
    smaller than a batch is repeated to fill it). ``num_epochs=k``: k passes in which every
    row of the data counts once over the shards, the last batch of a pass what is left, as
    petastorm's (shards may differ by a batch: for evaluation, not for training steps). As
    petastorm's, the dataset is a ``tf.compat.v1`` one (``make_one_shot_iterator()``).

    Example:
        >>> with tf_dataset(data, opts, None) as ds:  # doctest: +SKIP
        ...     next(iter(ds)).features.shape
        TensorShape([32, 64])
    """
    import tensorflow as tf
    from tensorflow.python.data.ops.dataset_ops import DatasetV1Adapter

    bad = [n for n in opts.outputs if not n.isidentifier()]
    if bad:
        raise ValueError(
            f"columns {bad} are not Python identifiers, so they cannot be namedtuple fields "
            f"(petastorm's batches are namedtuples): rename them in Spark first "
            f"(df.withColumnRenamed), or read them with make_torch_dataloader (dicts)"
        )
    row = collections.namedtuple("inferred_schema_view", opts.outputs)  # type: ignore[misc]
    data = view(data, opts)
    with data.tf_dataset(
        opts.batch_size, shuffle=opts.shuffle, seed=opts.seed, cur_shard=opts.cur_shard,
        shard_count=opts.shard_count, prefetch=tf.data.AUTOTUNE if prefetch is None else prefetch,
        passes=opts.num_epochs, strict=False,
    ) as ds:  # fmt: skip
        # petastorm's datasets come from tf.compat.v1 (older notebooks call
        # ds.make_one_shot_iterator()): the same class, over the same pipeline.
        yield DatasetV1Adapter(ds.map(lambda batch: row(**batch)))


__all__ = ["tf_dataset"]
