"""What ``fit`` trains on: prepared data (:func:`hvdrunner.data.prepare`), hvdrunner's
petastorm-style converter (:mod:`hvdrunner.petastorm.spark`, read as the prepared data it
is), or a real Petastorm ``SparkDatasetConverter`` (stacks with petastorm, pyarrow < 15).

Both become an endless ``tf.data.Dataset`` of ``(features, label)`` batches with one
``steps_per_epoch`` common to every rank. Petastorm shards by row group, so its shards are
unequal (42,668 vs 7,332 rows of 50,000 in our field notes): with a finite stream the rank
with fewer rows would stop early and the others would hang in their next allreduce. Here
every rank reads an endless stream and runs ``ceil(rows / (batch_size * ranks))`` steps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from hvdrunner.petastorm.spark import SparkDatasetConverter


def is_petastorm_converter(data: Any) -> bool:
    return hasattr(data, "make_tf_dataset") and hasattr(data, "dataset_size")


@contextlib.contextmanager
def _petastorm_dataset(
    converter: Any, batch_size: int, shuffle: bool, features: str, label: str | None
) -> Iterator[Any]:
    import horovod.tensorflow as hvd

    with converter.make_tf_dataset(
        batch_size=batch_size,
        num_epochs=None,  # endless: equal steps come from steps_per_epoch, not the shard
        cur_shard=hvd.rank(),
        shard_count=hvd.size(),
        shuffling_queue_capacity=batch_size * 20 if shuffle else 0,
    ) as ds:
        if label is None:
            yield ds.map(lambda b: getattr(b, features))
        else:
            yield ds.map(lambda b: (getattr(b, features), getattr(b, label)))


def training_input(
    data: Any,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    first_epoch: int = 0,
    features: str | None = None,
    label: str | None = None,
    in_memory: bool | None = None,
) -> tuple[int, int, contextlib.AbstractContextManager[Any]]:
    """``(steps_per_epoch, rows, context manager yielding the dataset)`` for this rank."""
    if isinstance(data, SparkDatasetConverter):  # hvdrunner's own: equal shards, resumable
        data = data.prepared(features or "", label)
    if is_petastorm_converter(data):
        import horovod.tensorflow as hvd

        if not features:
            raise ValueError(
                "a Petastorm converter needs features='<column>' (and label='<column>') "
                "passed to fit: the converter's batches hold every column of its DataFrame"
            )
        rows = int(data.dataset_size)
        steps = max(1, math.ceil(rows / (batch_size * hvd.size())))
        return steps, rows, _petastorm_dataset(data, batch_size, shuffle, features, label)
    steps = data.steps_per_epoch(batch_size)
    ctx = data.tf_dataset(
        batch_size, shuffle=shuffle, seed=seed, first_epoch=first_epoch, in_memory=in_memory
    )
    return steps, int(data.num_rows), ctx
