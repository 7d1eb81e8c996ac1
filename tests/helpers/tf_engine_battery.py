"""One rank of a job that uses hvdrunner.hvd_tensorflow (Horovod's TensorFlow API on the
engine) as ``horovod.tensorflow`` users do, eagerly and inside ``tf.function``.

Run on 2 ranks by tests/test_engine_tf.py under torchrun with horovod unimportable and
``HVDRUNNER_DEADLOCK_S=2``. Every check compares with numpy on the ranks' known inputs. Each
rank writes ``OUT/rank<r>.json``: every case's name and ``"ok"`` or what went wrong.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import hvdrunner.hvd_tensorflow as hvd

RESULTS: dict[str, str] = {}
R = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
BOUND_S = 30.0
MODES = {"eager": lambda f: f, "tf.function": tf.function}


def case(fn: Callable[[], None]) -> Callable[[], None]:
    try:
        fn()
        RESULTS[fn.__name__] = "ok"
    except Exception:  # noqa: BLE001 - recorded, shown by the test
        RESULTS[fn.__name__] = traceback.format_exc(limit=8)
    print(f"rank {R}: {fn.__name__}: {RESULTS[fn.__name__]}", file=sys.stderr, flush=True)
    return fn


def data(rank: int, dtype: Any, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    """Rank ``rank``'s input: known on every rank, different per rank."""
    values = np.arange(np.prod(shape)).reshape(shape) % 7 + 2 * rank + 1
    return values.astype(dtype.as_numpy_dtype)


def raises(kind: type[BaseException], fn: Callable[[], object], *words: str) -> None:
    started = time.monotonic()
    try:
        fn()
    except kind as exc:
        assert time.monotonic() - started < BOUND_S, "took too long"
        assert all(w in str(exc) for w in words), f"{words} not all in {str(exc)[:400]!r}"
        return
    raise AssertionError(f"did not raise {kind.__name__}")


hvd.init()


@case
def allreduce_every_op_and_type() -> None:
    reference = {hvd.Sum: np.sum, hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}
    for mode, wrap in MODES.items():
        for dtype in (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64):
            everyone = np.stack([data(r, dtype) for r in range(N)]).astype(np.float64)
            for op, ref in reference.items():
                got = wrap(lambda x, op=op: hvd.allreduce(x, op=op))(tf.constant(data(R, dtype)))
                want = ref(everyone, axis=0)
                assert got.dtype == dtype, (mode, dtype, op)
                np.testing.assert_allclose(
                    np.asarray(got, np.float64),
                    want,
                    rtol=1e-2,
                    err_msg=f"{mode} {dtype.name} op={op}",
                )
            if dtype.is_floating:
                got = wrap(lambda x: hvd.allreduce(x, prescale_factor=0.5, postscale_factor=3.0))(
                    tf.constant(data(R, dtype))
                )
                np.testing.assert_allclose(
                    np.asarray(got, np.float64), everyone.mean(axis=0) * 1.5, rtol=1e-2
                )


@case
def grouped_allreduce_mixed_types_and_fp16_compression() -> None:
    for wrap in MODES.values():
        tensors = [tf.constant(data(R, tf.float32)), tf.constant(data(R, tf.float64, (5,)))]
        got = wrap(
            lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, compression=hvd.Compression.fp16)
        )(*tensors)
        assert [g.dtype for g in got] == [tf.float32, tf.float64]
        for g, shape, dtype in zip(got, [(3, 4), (5,)], [tf.float32, tf.float64], strict=True):
            want = sum(data(r, dtype, shape) for r in range(N))
            np.testing.assert_allclose(g.numpy(), want)


@case
def allgather_uneven_and_grouped() -> None:
    for wrap in MODES.values():
        mine = tf.constant(data(R, tf.float32, (R + 1, 2)))
        got = wrap(lambda x: hvd.allgather(x))(mine)
        want = np.concatenate([data(r, tf.float32, (r + 1, 2)) for r in range(N)])
        np.testing.assert_array_equal(got.numpy(), want)
        a, b = wrap(lambda x, y: hvd.grouped_allgather([x, y]))(mine, mine * 2.0)
        np.testing.assert_array_equal(a.numpy(), want)
        np.testing.assert_array_equal(b.numpy(), want * 2.0)
        ids = wrap(lambda x: hvd.allgather(x))(tf.constant([R], tf.uint16))  # no uint16 in gloo
        assert ids.dtype == tf.uint16 and ids.numpy().tolist() == list(range(N))


@case
def broadcast_and_variables() -> None:
    for wrap in MODES.values():
        got = wrap(lambda x: hvd.broadcast(x, root_rank=1))(tf.constant(data(R, tf.int32)))
        np.testing.assert_array_equal(got.numpy(), data(1, tf.int32))
    v = tf.Variable(data(R, tf.float32))
    hvd.broadcast_variables([v], root_rank=1)
    np.testing.assert_array_equal(v.numpy(), data(1, tf.float32))
    assert hvd.broadcast_object({"rank": R}, root_rank=1) == {"rank": 1}
    assert hvd.allgather_object(R * 10) == [r * 10 for r in range(N)]


@case
def alltoall_with_splits_and_reducescatter() -> None:
    for wrap in MODES.values():
        rows = tf.constant(np.arange(3 * N, dtype=np.float32).reshape(3 * N, 1) + 100 * R)
        splits = tf.constant([1] * (N - 1) + [3 * N - (N - 1)], tf.int32)
        out, received = wrap(lambda x, s: hvd.alltoall(x, splits=s))(rows, splits)
        mine = 1 if R < N - 1 else 3 * N - (N - 1)
        assert received.numpy().tolist() == [mine] * N
        got = wrap(lambda x: hvd.reducescatter(x, op=hvd.Sum))(
            tf.constant(data(R, tf.float32, (5, 2)))
        )
        total = sum(data(r, tf.float32, (5, 2)) for r in range(N))
        start = [0, 3][R]  # 5 rows over 2 ranks: the first rank gets the extra row
        np.testing.assert_allclose(got.numpy(), total[start : start + (3 if R == 0 else 2)])
        assert out.shape[0] == mine * N


@case
def gradients_are_horovods() -> None:
    x = tf.Variable(data(R, tf.float32, (2, 2)))
    with tf.GradientTape(persistent=True) as tape:
        summed = tf.reduce_sum(hvd.allreduce(x * 2.0, op=hvd.Sum))
        gathered = tf.reduce_sum(hvd.allgather(x) * float(R + 1))
        cast = tf.reduce_sum(hvd.broadcast(x, root_rank=0) * 3.0)
    np.testing.assert_allclose(tape.gradient(summed, x).numpy(), np.full((2, 2), 2.0 * N))
    mean_weight = np.mean([r + 1 for r in range(N)])  # the averaged gradient's rows
    np.testing.assert_allclose(tape.gradient(gathered, x).numpy(), np.full((2, 2), mean_weight))
    np.testing.assert_allclose(
        tape.gradient(cast, x).numpy(), np.full((2, 2), 3.0 if R == 0 else 0.0)
    )


@case
def distributed_gradient_tape_averages() -> None:
    w = tf.Variable([1.0, 2.0])
    local = tf.Variable([5.0])
    for groups in (None, 1):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * float(R + 1)) + tf.reduce_sum(local * float(R + 1))
        tape = hvd.DistributedGradientTape(tape, num_groups=groups or 0)
        tape.register_local_source(local)
        gw, gl = tape.gradient(loss, [w, local])
        np.testing.assert_allclose(gw.numpy(), [np.mean(np.arange(N) + 1)] * 2)
        np.testing.assert_allclose(gl.numpy(), [(R + 1) / N])


@case
def mismatches_fail_on_every_rank_never_hang() -> None:
    shape = (3,) if R == 0 else (4,)
    raises(
        tf.errors.FailedPreconditionError,
        lambda: hvd.allreduce(tf.ones(shape)),
        "Mismatched allreduce tensor shapes",
    )
    dtype = tf.float32 if R == 0 else tf.float64
    raises(
        tf.errors.FailedPreconditionError,
        lambda: hvd.allreduce(tf.ones([2], dtype)),
        "Mismatched allreduce",
    )
    raises(
        tf.errors.FailedPreconditionError,
        lambda: hvd.broadcast(tf.ones([2]), root_rank=R),
        "Mismatched broadcast",
    )
    # inside a graph too: Horovod's error and words, in tf.function and a TensorFlow 1 session
    fn = tf.function(lambda: hvd.allreduce(tf.ones(shape), name="in_graph"))
    raises(tf.errors.FailedPreconditionError, fn, "Mismatched allreduce tensor shapes")
    with tf.Graph().as_default():
        op = hvd.broadcast(tf.ones([2]), root_rank=R, name="in_session")
        with tf.compat.v1.Session() as sess:
            raises(tf.errors.FailedPreconditionError, lambda: sess.run(op), "Mismatched broadcast")
    raises(
        tf.errors.InvalidArgumentError,
        lambda: hvd.allreduce(tf.ones([2], tf.uint16)),
        "not supported",
    )
    raises(NotImplementedError, lambda: hvd.allreduce(tf.ones([2]), op=hvd.Adasum))
    assert hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy().tolist() == [float(N)]


@case
def sync_batch_norm_is_one_batch_norm_over_every_ranks_batch() -> None:
    """Outputs, moving statistics and input gradients as Keras' BatchNormalization over the
    ranks' batches stacked (the allreduce's gradient sums the other ranks' share back)."""
    batches = [data(r, tf.float32, (4, 3)) * (r + 1) for r in range(N)]
    weights = [data(r + 7, tf.float32, (4, 3)) for r in range(N)]
    for mode, wrap in MODES.items():
        sync = hvd.SyncBatchNormalization(momentum=0.5)
        plain = tf.keras.layers.BatchNormalization(momentum=0.5)
        x_mine, x_all = tf.constant(batches[R]), tf.constant(np.concatenate(batches))

        def step(layer, x, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = layer(x, training=True)
                loss = tf.reduce_sum(out * w)
            return out, tape.gradient(loss, x)

        out, grad = wrap(functools.partial(step, sync, x_mine, tf.constant(weights[R])))()
        ref_out, ref_grad = step(plain, x_all, tf.constant(np.concatenate(weights)))
        rows = slice(4 * R, 4 * R + 4)
        np.testing.assert_allclose(out.numpy(), ref_out.numpy()[rows], atol=1e-5, err_msg=mode)
        np.testing.assert_allclose(grad.numpy(), ref_grad.numpy()[rows], atol=1e-5, err_msg=mode)
        for mine, theirs in ((sync.moving_mean, plain.moving_mean),
                             (sync.moving_variance, plain.moving_variance)):  # fmt: skip
            np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-5)


@case
def graph_mode_collectives_in_any_order() -> None:
    """TensorFlow 1 graphs: many collectives built before one session.run, each blocking a
    thread of the session's small pool while it waits, must all complete."""
    with tf.Graph().as_default():
        outs = [hvd.allreduce(tf.constant([float(i + R)]), op=hvd.Sum) for i in range(12)]
        with tf.compat.v1.Session(
            config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
        ) as sess:
            got = sess.run(outs)
    assert [float(g[0]) for g in got] == [float(N * i + sum(range(N))) for i in range(12)]


hvd.shutdown()
out = sys.argv[1]
with open(os.path.join(out, f"rank{R}.json"), "w") as f:
    json.dump(RESULTS, f)
