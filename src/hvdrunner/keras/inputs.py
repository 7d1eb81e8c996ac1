"""What ``fit`` trains on: prepared data (:func:`hvdrunner.data.prepare`), hvdrunner's
petastorm-style converter (:mod:`hvdrunner.petastorm.spark`, read as the prepared data it
is), or a real Petastorm ``SparkDatasetConverter`` (stacks with petastorm, pyarrow < 15).

Both become an endless stream of ``(features, label)`` batches with one ``steps_per_epoch``
common to every rank: a ``tf.data.Dataset`` on TensorFlow, a torch ``DataLoader`` of the same
batches on Keras' PyTorch backend (Keras moves them to its device). Petastorm shards by row group, so its shards are
unequal (42,668 vs 7,332 rows of 50,000 in our field notes): with a finite stream the rank
with fewer rows would stop early and the others would hang in their next allreduce. Here
every rank reads an endless stream and runs ``ceil(rows / (batch_size * ranks))`` steps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from hvdrunner.data.handle import prepared_behind
from hvdrunner.keras import backend

PETASTORM_ON_TORCH = (
    "a real Petastorm converter feeds tf.data, which Keras' PyTorch backend cannot train on "
    "here: use hvdrunner's converter (from hvdrunner.petastorm.spark import "
    "make_spark_converter), or hvdrunner.data.prepare(df, ...), with the same columns"
)


def is_petastorm_converter(data: Any) -> bool:
    return hasattr(data, "make_tf_dataset") and hasattr(data, "dataset_size")


@contextlib.contextmanager
def _petastorm_dataset(
    converter: Any, batch_size: int, shuffle: bool, features: str, label: str | None
) -> Iterator[Any]:
    hvd = backend.horovod()
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
    # hvdrunner's own converter is prepared data: equal shards, resumable
    data = prepared_behind(data, features, label) or data
    if is_petastorm_converter(data):
        if backend.is_torch():
            raise TypeError(PETASTORM_ON_TORCH)
        hvd = backend.horovod()
        if not features:
            raise ValueError(
                "a Petastorm converter needs features='<column>' (and label='<column>') "
                "passed to fit: the converter's batches hold every column of its DataFrame"
            )
        rows = int(data.dataset_size)
        steps = max(1, math.ceil(rows / (batch_size * hvd.size())))
        return steps, rows, _petastorm_dataset(data, batch_size, shuffle, features, label)
    steps = data.steps_per_epoch(batch_size)
    ctx = prepared_input(data, batch_size, shuffle=shuffle, seed=seed, first_epoch=first_epoch,
                         in_memory=in_memory)  # fmt: skip
    return steps, int(data.num_rows), ctx


def prepared_input(
    data: Any, batch_size: int, *, shuffle: bool, seed: int = 0, first_epoch: int = 0,
    in_memory: bool | None = None,
) -> contextlib.AbstractContextManager[Any]:  # fmt: skip
    """Endless batches of this rank's shard of prepared ``data`` for Keras' fit: a
    ``tf.data.Dataset`` on TensorFlow, a torch ``DataLoader`` of ``(x, y)`` on PyTorch."""
    if not backend.is_torch():
        return data.tf_dataset(
            batch_size, shuffle=shuffle, seed=seed, first_epoch=first_epoch, in_memory=in_memory
        )
    return _numpy_batches(data, batch_size, shuffle, seed, first_epoch, in_memory)


@contextlib.contextmanager
def _numpy_batches(
    data: Any, batch_size: int, shuffle: bool, seed: int, first_epoch: int,
    in_memory: bool | None,
) -> Iterator[Any]:  # fmt: skip
    """A torch ``DataLoader`` over the numpy feed, each iteration a fresh stream from
    ``first_epoch``: Keras re-iterates its validation input at every evaluation, and a plain
    generator would replay Keras' peeked first batches and then continue mid-stream (rows
    out of order and out of step with the TensorFlow path)."""
    import torch

    streams: list[Any] = []
    base: Any = torch.utils.data.IterableDataset

    class Stream(base):
        def __iter__(self) -> Iterator[Any]:
            feed = data.batches(batch_size, shuffle=shuffle, seed=seed,
                                first_epoch=first_epoch, in_memory=in_memory)  # fmt: skip
            streams.append(feed)
            return (data.structure(batch) for batch in feed)

    try:
        yield torch.utils.data.DataLoader(Stream(), batch_size=None)
    finally:
        for feed in streams:
            close = getattr(feed, "close", None)
            if close is not None:  # the reader's read-ahead threads end with it
                close()
