"""Where a training step's time goes, np=1 and np=2, and what each exchange knob changes.

MLP 784-1024-1024-10 (1.9 M params, 7.45 MB of float32 gradients), batch 128 per rank,
16,384 rows (weak scaling: each rank has the same steps as np=1 has per rank), plain SGD,
1 TF intra/inter-op thread per rank (TF_NUM_*_THREADS), driver-process ranks. Each variant
is one HorovodRunner job; the figure is the median of its steady epochs (all but the first).

- ``no_exchange``: the Horovod Keras recipe without DistributedOptimizer, in-memory numpy:
  every rank trains alone. The CPUs' own limit at this np (same run, same machine).
- ``recipe``: the standard Horovod Keras recipe (``hvdrunner.hvd_keras``), in-memory numpy.
- ``fit``: ``hvdrunner.keras.fit`` on the same rows ``prepare``d as Parquet (the shard
  held in memory, the default when it fits); ``fit in_memory=False``: streamed from disk.
- np=2 knobs on ``fit``: ``compression="fp16"``, ``backward_passes_per_step`` 2 and 4,
  ``fusion_threshold_mb=0`` (no fusion buffer), ``cycle_time_ms`` 0.2, 5 and 20, and
  ``backward_passes_per_step=4`` with ``cycle_time_ms=5``.
- alone, at np=2: one grouped allreduce of the model's gradients; the feed without a model
  (``tf_dataset`` batches per second); a raw TCP transfer over loopback (bandwidth).

Per-step breakdown at np=2: compute = ``no_exchange`` step; gradient exchange = ``recipe``
step - compute; input = ``fit`` step - ``recipe`` step (what the feed adds on the critical
path). Results: ``benchmarks/results/scaling-<stack>.json``.

    .venv-18/bin/python benchmarks/scaling.py [--rows 16384 --epochs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _bench import context, save

RESULTS = Path(__file__).parent / "results"
BATCH = 128
WIDTH = 784


def _pixels(ids):
    import numpy as np

    j = np.arange(1, WIDTH + 1, dtype=np.int64)
    return (((ids[:, None] * j) % 997).astype("float32") / 997).astype("float32")


def _model(keras):
    return keras.Sequential([
        keras.Input(shape=(WIDTH,)), keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10),
    ])  # fmt: skip


def _clock(keras, marks: list[float]):
    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            marks.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            marks.append(time.perf_counter())

    return Clock()


def recipe(rows: int, epochs: int, exchange: bool) -> dict:
    """The standard Horovod Keras recipe on in-memory numpy (this rank's rows)."""
    import numpy as np

    import hvdrunner.hvd_keras as hvd
    from hvdrunner.keras import compat

    keras = compat.keras_module()
    hvd.init()
    per = rows // hvd.size()
    ids = np.arange(hvd.rank() * per, (hvd.rank() + 1) * per)
    x, y = _pixels(ids), (ids % 10).astype("int32")
    model = _model(keras)
    opt = keras.optimizers.SGD(0.01 * hvd.size())
    if exchange:
        opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    marks: list[float] = []
    cbs = [_clock(keras, marks), hvd.callbacks.MetricAverageCallback()]
    if exchange:
        cbs.insert(0, hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=cbs)
    return {"marks": marks}


def fit_job(data, epochs: int, **knobs) -> dict:
    """``hvdrunner.keras.fit`` on the prepared rows, the same model, batch and optimizer."""
    from hvdrunner.keras import compat, fit

    keras = compat.keras_module()
    marks: list[float] = []
    fit(
        lambda: _model(keras), data, epochs=epochs, batch_size=BATCH, optimizer="sgd",
        learning_rate=0.01, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        log_model=False, verbose=0, callbacks=[_clock(keras, marks)], **knobs,
    )  # fmt: skip
    return {"marks": marks}


def alone(data) -> dict:
    """At np=2: the feed without a model, and one grouped allreduce of the gradients."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from hvdrunner.keras import compat

    hvd.init()
    steps = data.steps_per_epoch(BATCH)
    feed_ms = {}
    for name, in_memory in (("in_memory", True), ("streaming", False)):
        with data.tf_dataset(BATCH, in_memory=in_memory) as ds:
            it = iter(ds)
            for _ in range(steps):  # first epoch (in memory: the decode)
                next(it)
            t = time.perf_counter()
            for _ in range(2 * steps):
                next(it)
            feed_ms[name] = round(1000 * (time.perf_counter() - t) / (2 * steps), 2)
    grads = [tf.ones_like(v) for v in _model(compat.keras_module()).trainable_variables]
    for _ in range(3):
        hvd.grouped_allreduce(grads, op=hvd.Average)
    t = time.perf_counter()
    for _ in range(20):
        hvd.grouped_allreduce(grads, op=hvd.Average)
    return {
        "feed_ms_per_batch": feed_ms,
        "allreduce_alone_ms": round(1000 * (time.perf_counter() - t) / 20, 1),
        "grad_bytes": int(sum(int(np.prod(g.shape)) * 4 for g in grads)),
    }


def loopback_gb_per_s(total: int = 256 << 20, chunk: int = 1 << 20) -> float:
    """One TCP stream over 127.0.0.1 (what gloo's ring uses between local ranks)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    got = [0]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while got[0] < total and (buf := conn.recv(chunk)):
                got[0] += len(buf)

    th = threading.Thread(target=sink)
    th.start()
    payload = b"\0" * chunk
    with socket.create_connection(server.getsockname()) as c:
        t = time.perf_counter()
        for _ in range(total // chunk):
            c.sendall(payload)
        th.join()
        seconds = time.perf_counter() - t
    server.close()
    return round(total / seconds / 1e9, 2)


def _step_ms(marks: list[float], steps: int) -> float:
    epochs = [marks[i + 1] - marks[i] for i in range(0, len(marks), 2)][1:]  # steady only
    return round(1000 * statistics.median(epochs) / steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=16_384)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["TF_NUM_INTRAOP_THREADS"] = os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    from pyspark.sql import functions as F

    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="bench-scaling")
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(args.rows).select(
        F.transform(F.sequence(F.lit(1), F.lit(WIDTH)),
                    lambda j: ((F.col("id") * j) % 997).cast("float") / 997).alias("pixels"),
        (F.col("id") % 10).cast("int").alias("label"),
    )  # fmt: skip
    cache = tempfile.mkdtemp(prefix="hvdrunner-bench-scaling-")
    data = prepare(df, features="pixels", label="label", cache_dir=cache)
    spark.stop()

    rows: list[dict] = []

    def run(np_: int, variant: str, fn, **kw) -> dict:
        out = HorovodRunner(np=-np_).run(fn, epochs=args.epochs, **kw)
        steps = args.rows // np_ // BATCH
        step = _step_ms(out["marks"], steps)
        row = {"np": np_, "variant": variant, "step_ms": step,
               "samples_per_s": round(np_ * BATCH * 1000 / step)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
        return row

    try:
        for np_ in (1, 2):
            run(np_, "no_exchange", recipe, rows=args.rows, exchange=False)
            run(np_, "recipe", recipe, rows=args.rows, exchange=True)
            run(np_, "fit", fit_job, data=data)
            run(np_, "fit in_memory=False", fit_job, data=data, in_memory=False)
        knobs = {
            "fit compression=fp16": {"compression": "fp16"},
            "fit backward_passes_per_step=2": {"backward_passes_per_step": 2},
            "fit backward_passes_per_step=4": {"backward_passes_per_step": 4},
            "fit fusion_threshold_mb=0": {"fusion_threshold_mb": 0},
            "fit cycle_time_ms=0.2": {"cycle_time_ms": 0.2},
            "fit cycle_time_ms=5": {"cycle_time_ms": 5},
            "fit cycle_time_ms=20": {"cycle_time_ms": 20},
            "fit backward_passes_per_step=4, cycle_time_ms=5": {
                "backward_passes_per_step": 4,
                "cycle_time_ms": 5,
            },
        }
        for name, kw in knobs.items():
            run(2, name, fit_job, data=data, **kw)
        parts = HorovodRunner(np=-2).run(alone, data=data)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    loopback = loopback_gb_per_s()

    by = {(r["np"], r["variant"]): r for r in rows}
    for r in rows:
        r["efficiency_vs_no_exchange"] = round(
            r["samples_per_s"] / by[(r["np"], "no_exchange")]["samples_per_s"], 3
        )
    sent = 2 * (2 - 1) / 2 * parts["grad_bytes"]  # ring allreduce: 2(n-1)/n of the bytes
    compute = by[(2, "no_exchange")]["step_ms"]
    exchange = round(by[(2, "recipe")]["step_ms"] - compute, 1)
    out = {
        "what": f"MLP {WIDTH}-1024-1024-10, batch {BATCH}/rank, {args.rows} rows, SGD, "
        f"median of {args.epochs - 1} steady epochs, 1 TF thread per rank, driver-process ranks",
        "rows": rows,
        "fit_over_recipe": {
            f"np{n}{tag}": round(
                by[(n, variant)]["samples_per_s"] / by[(n, "recipe")]["samples_per_s"], 3
            )
            for n in (1, 2)
            for tag, variant in (("", "fit"), ("_streaming", "fit in_memory=False"))
        },
        "cpu_scaling_no_exchange_np2_over_2x_np1": round(
            by[(2, "no_exchange")]["samples_per_s"] / (2 * by[(1, "no_exchange")]["samples_per_s"]),
            3,
        ),
        "np2_step_breakdown_ms": {
            "compute": compute,
            "gradient_exchange": exchange,
            "input": round(by[(2, "fit")]["step_ms"] - by[(2, "recipe")]["step_ms"], 1),
            "input_streaming": round(
                by[(2, "fit in_memory=False")]["step_ms"] - by[(2, "recipe")]["step_ms"], 1
            ),
            "feed_alone_ms_per_batch": parts["feed_ms_per_batch"],
            "allreduce_alone": parts["allreduce_alone_ms"],
        },
        "exchange": {
            "grad_mb": round(parts["grad_bytes"] / 1e6, 2),
            "mb_sent_per_rank_per_step": round(sent / 1e6, 2),
            "loopback_tcp_gb_per_s": loopback,
            "wire_time_at_loopback_ms": round(1000 * sent / (loopback * 1e9), 1),
            "allreduce_alone_effective_gb_per_s": round(
                sent / (parts["allreduce_alone_ms"] / 1000) / 1e9, 2
            ),
        },
        **context(),
    }
    save(RESULTS / f"scaling-{out['stack']}.json", out)


if __name__ == "__main__":
    main()
