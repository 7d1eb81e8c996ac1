"""The tf.data feed of :meth:`PreparedData.tf_dataset`: a rank's shard as a
``tf.data.Dataset`` of batches, in memory, streamed, or from a Python feed (a transform that
decodes on the ranks, or an evaluation pass).

The data layer's only TensorFlow: imported inside each function, so nothing here needs
TensorFlow until a TensorFlow rank asks for a dataset (the torch feed is
:mod:`hvdrunner.torch.inputs`; both read the rows through :mod:`hvdrunner.data.reader`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np

from hvdrunner.data.reader import (
    Piece,
    epoch_indices,
    load_shard,
    pass_plan,
    read_piece,
)

# ``data`` below is a PreparedData; typed Any so that this module imports nothing of the
# handle (which imports it): the import graph stays one-way.


def memory_dataset(
    data: Any, pieces: list[Piece], batch_size: int, shuffle: bool, seed: int, shard: int,
    first_epoch: int,
) -> Any:  # fmt: skip
    # TensorFlow ops only, after the one decode: no Python per batch. Python in the
    # pipeline (from_generator) slowed Keras 3 steps by ~45% here (measured with the
    # scaling benchmark's MLP at np=1: 69 vs 47 ms), even when called once per 8 batches.
    import tensorflow as tf

    lengths = [p.stop - p.start for p in pieces]
    steps = math.ceil(sum(lengths) / batch_size)
    tensors = {
        k: tf.convert_to_tensor(v)
        for k, v in load_shard(data.local_path, pieces, data.columns, data.read_ahead).items()
    }

    def order(epoch: np.ndarray) -> np.ndarray:  # once per epoch
        return epoch_indices(lengths, batch_size, shuffle, seed, shard, int(epoch))

    def epoch_batches(epoch: Any) -> Any:
        idx = tf.numpy_function(order, [epoch], tf.int64, stateful=False)
        return tf.data.Dataset.from_tensor_slices(tf.reshape(idx, (steps, batch_size)))

    epochs = tf.data.Dataset.range(first_epoch, 2**62)
    return epochs.flat_map(epoch_batches).map(
        lambda ix: data.structure({k: tf.gather(t, ix) for k, t in tensors.items()})
    )


def stream_dataset(
    data: Any, pieces: list[Piece], batch_size: int, shuffle: bool, seed: int, shard: int,
    first_epoch: int,
) -> Any:  # fmt: skip
    # Streaming without from_generator (see _memory_dataset): a stateless numpy_function
    # decodes one planned piece (read_ahead in parallel), TensorFlow re-batches the rows.
    import tensorflow as tf

    lengths = [p.stop - p.start for p in pieces]
    need = math.ceil(sum(lengths) / batch_size) * batch_size - sum(lengths)

    # One plan per epoch, not one per piece: a plan holds every piece's permutation.
    plan_of = functools.lru_cache(maxsize=2)(
        lambda epoch: pass_plan(lengths, shuffle, seed, shard, epoch)
    )

    def load(epoch: np.ndarray, j: np.ndarray) -> list[np.ndarray]:
        """Piece ``j`` of the pass's plan, unshuffled, and the row order to take."""
        plan = plan_of(int(epoch))
        if j < len(plan):
            i, perm = plan[j]
            rows = read_piece(data.local_path, pieces[i], data.columns)
            order = perm if perm is not None else np.arange(lengths[i])
            return [*rows.values(), order.astype(np.int64)]
        # The padding of the last batch: the pass's own first rows (as iter_batches).
        i, perm = plan[0]
        first = read_piece(data.local_path, pieces[i], data.columns)
        head = (perm if perm is not None else np.arange(lengths[i]))[:batch_size]
        pick = np.resize(head, need)
        return [*(np.take(v, pick, axis=0) for v in first.values()), np.arange(need)]

    dtypes = [tf_dtype(c.dtype) for c in data.columns] + [tf.int64]

    def rows_of(epoch: Any, j: Any) -> Any:
        *out, order = tf.numpy_function(load, [epoch, j], dtypes, stateful=False)
        order.set_shape((None,))
        cols = {}
        for t, c in zip(out, data.columns, strict=True):
            t.set_shape((None, *c.shape))
            # The shuffle, in TensorFlow's threads (measured faster than np.take here).
            cols[c.name] = tf.gather(t, order) if shuffle else t
        return data.structure(cols)

    per_pass = len(pieces) + (1 if need else 0)
    jobs = tf.data.Dataset.range(first_epoch, 2**62).flat_map(
        lambda e: tf.data.Dataset.range(per_pass).map(lambda j: (e, j))
    )
    rows = jobs.map(rows_of, num_parallel_calls=data.read_ahead, deterministic=True)
    return rows.rebatch(batch_size, drop_remainder=True)


def generator_dataset(
    feed: Callable[[], Iterator[dict[str, Any]]], structure: Callable[[dict[str, Any]], Any],
    partial: bool, variable: dict[str, tuple[int, ...]] | None = None,
) -> Any:  # fmt: skip
    """A dataset of the numpy batches ``feed()`` yields (a transform's, or an evaluation
    pass's), each as ``structure`` shapes it; ``partial``: the last batch may be smaller;
    ``variable``: per column, the axes whose length changes from batch to batch.

    Its element spec is read off the first batch (binary and string columns as
    ``tf.string``; ``variable`` axes as ``None``); that batch's reader is closed at once.
    """
    import tensorflow as tf

    def gen() -> Generator[Any, None, None]:
        batches = feed()
        try:
            for batch in batches:
                yield structure(batch)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    probe = feed()
    try:
        sample = next(probe)
    except StopIteration:  # an empty shard: nothing to evaluate here
        sample = None
    finally:
        close = getattr(probe, "close", None)
        if close is not None:
            close()
    if sample is None:
        return tf.data.Dataset.from_tensors(0).take(0)

    def spec(name: str, a: np.ndarray) -> Any:
        free = (variable or {}).get(name, ())
        shape = [None if (i == 0 and partial) or i in free else n for i, n in enumerate(a.shape)]
        return tf.TensorSpec(shape=shape, dtype=tf_dtype(a.dtype))

    signature = structure({name: spec(name, a) for name, a in sample.items()})
    return tf.data.Dataset.from_generator(gen, output_signature=signature)


def tf_dtype(dtype: Any) -> Any:
    """TensorFlow's dtype for a column's numpy dtype: binary and string columns (``object``,
    holding ``bytes``/``str``) are ``tf.string``."""
    import tensorflow as tf

    return tf.string if np.dtype(dtype) == object else tf.as_dtype(dtype)
