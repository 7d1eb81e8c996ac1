"""Keras, side by side in one run (modern stack, local[2]): HorovodRunner against what
Databricks recommends instead of it, ``tf.distribute`` through spark-tensorflow-distributor's
``MirroredStrategyRunner`` (MultiWorkerMirroredStrategy over Spark barrier tasks, as
Databricks documents it: the runner wraps the function in the strategy's scope, the input is
batched by the global batch and auto-sharded by DATA).

Four contenders train the same model on the same rows with the same global batch and
optimizer, 2 processes each, interleaved rep by rep so drift hits all alike:

- ``hvdrunner.keras.fit`` on the rows ``prepare``d as Parquet (under ``HorovodRunner(np=2)``),
  on hvdrunner's engine (the default where torch is installed) and again on the compiled
  horovod (``HVDRUNNER_ENGINE=horovod``);
- the standard Horovod Keras recipe (``hvdrunner.hvd_keras``: DistributedOptimizer,
  broadcast and metric-average callbacks) on this rank's rows in memory;
- ``MirroredStrategyRunner(num_slots=2, use_gpu=False)`` on the same rows in memory.

MultiWorkerMirroredStrategy's ``model.fit`` does not run under Keras 3 (``ValueError: Attempt
to convert a value (PerReplica...)``; keras-team/keras#20585, open): the comparison runs in
the modern stack's tf_keras mode (``TF_USE_LEGACY_KERAS=1``: TF 2.21 with tf_keras), where all
three work, and a small probe records what the same runner does under Keras 3.

Data: a learnable synthetic task (x uniform in [0, 1)^784, y = argmax((x - 0.5) W) for a fixed
random W, 10 classes), ``--rows`` to train and 4,000 held out. Model: MLP 784-256-10, Adam
(learning rate 0.001 x 2 processes), batch 64 per process (global 128). Figures: launch
(call -> the function's first line; wall minus the epochs), steady rows/s (epochs 2..E) and
the held-out accuracy of rank 0's / the chief's final weights, computed on the driver.
Results in benchmarks/results/tf_distribute_comparison-modern.json.

    .venv-18/bin/python benchmarks/tf_distribute_comparison.py [--rows 40000 --epochs 4 --reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _bench import context, save, stack
from scaling import _clock  # epoch begin/end marks, as in the scaling benchmark

RESULTS = Path(__file__).parent / "results"
BATCH = 64  # per process
PROCS = 2
LR = 0.001 * PROCS
HELD_OUT = 4000


def _task(rows: int, seed: int = 27):
    """(x, y) of the learnable synthetic task: the same rows on every call."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((784, 10)).astype("float32")
    x = rng.random((rows, 784), dtype=np.float32)
    return x, ((x - 0.5) @ w).argmax(axis=1).astype("int64")  # centred: balanced classes


def _model(keras):
    return keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(10)])  # fmt: skip


def _loss(keras):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _rows(path: str):
    """Every row of the Parquet files at ``path`` as (x, y) numpy arrays."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["x", "y"])
    x = pc.list_flatten(table["x"].combine_chunks()).to_numpy().reshape(-1, 784)
    return x.astype("float32"), table["y"].to_numpy().astype("int64")


def hvdrunner_fit(data, epochs: int) -> dict:
    started = time.time()
    from hvdrunner.keras import compat, fit

    keras = compat.keras_module()
    marks: list[float] = []
    weights: list = []

    class Keep(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            weights.append([w.copy() for w in self.model.get_weights()])

    fit(lambda: _model(keras), data, epochs=epochs, batch_size=BATCH, optimizer="adam",
        learning_rate=LR / PROCS, loss=_loss(keras), log_model=False, verbose=0,
        callbacks=[_clock(keras, marks), Keep()])  # fmt: skip
    return {"started": started, "marks": marks, "weights": weights[0]}


def hvd_keras_recipe(path: str, epochs: int) -> dict:
    started = time.time()
    import hvdrunner.hvd_keras as hvd
    from hvdrunner.keras import compat

    keras = compat.keras_module()
    hvd.init()
    x, y = _rows(path)
    per = len(x) // hvd.size()  # equal shards: no rank waits for one that ran out
    x, y = (
        x[hvd.rank() * per : (hvd.rank() + 1) * per],
        y[hvd.rank() * per : (hvd.rank() + 1) * per],
    )
    model = _model(keras)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(LR))
    model.compile(optimizer=opt, loss=_loss(keras))
    marks: list[float] = []
    cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
           hvd.callbacks.MetricAverageCallback(), _clock(keras, marks)]  # fmt: skip
    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=cbs)
    return {"started": started, "marks": marks, "weights": model.get_weights()}


def mirrored_strategy(path: str, epochs: int) -> dict:
    """Databricks' documented shape: the runner opens the strategy's scope around this."""
    started = time.time()
    import tensorflow as tf

    from hvdrunner.keras import compat

    keras = compat.keras_module()
    x, y = _rows(path)
    steps = len(x) // (BATCH * PROCS)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10_000, seed=0)
               .batch(BATCH * PROCS, drop_remainder=True).repeat().with_options(options))  # fmt: skip
    model = _model(keras)
    model.compile(optimizer=keras.optimizers.Adam(LR), loss=_loss(keras))
    marks: list[float] = []
    model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0,
              callbacks=[_clock(keras, marks)])  # fmt: skip
    return {"started": started, "marks": marks, "weights": model.get_weights()}


def _compiled(call):
    """``call()`` with the job on the compiled horovod (HorovodRunner passes the setting on)."""
    os.environ["HVDRUNNER_ENGINE"] = "horovod"
    try:
        return call()
    finally:
        del os.environ["HVDRUNNER_ENGINE"]


def _accuracy(weights, x, y) -> float:
    import numpy as np

    w1, b1, w2, b2 = weights
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    return float((logits.argmax(axis=1) == y).mean())


def _summary(runs: list[dict], rows_per_epoch: int) -> dict:
    def epochs(marks):
        return [marks[i + 1] - marks[i] for i in range(0, len(marks), 2)]

    steady = [statistics.median(epochs(r["marks"])[1:]) for r in runs]
    return {
        "rows_per_s": round(rows_per_epoch / statistics.median(steady)),
        "step_ms": round(1000 * statistics.median(steady) / (rows_per_epoch // (BATCH * PROCS)), 2),
        "wall_s": round(statistics.median(r["wall"] for r in runs), 2),
        "launch_s": round(statistics.median(r["wall"] - sum(epochs(r["marks"])) for r in runs), 2),
        "to_first_line_s": round(statistics.median(r["to_first_line"] for r in runs), 2),
        "held_out_accuracy": round(statistics.median(r["accuracy"] for r in runs), 4),
    }


def keras3_probe() -> dict:
    """MirroredStrategyRunner's smallest job under Keras 3, in a fresh process and Spark."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    out = subprocess.run([sys.executable, __file__, "--probe"], env=env, capture_output=True,
                         text=True, timeout=600, check=False)  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(lines[-1][6:]) if lines else {"ok": False, "error": out.stderr[-300:]}


def _probe() -> None:
    from spark_tensorflow_distributor import MirroredStrategyRunner

    from hvdrunner.keras import compat
    from hvdrunner.spark import local_session

    local_session(f"local[{PROCS}]", app_name="probe").sparkContext.setLogLevel("OFF")
    x, y = _task(BATCH * PROCS * 4)
    with tempfile.TemporaryDirectory() as tmp:
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 784)
        pq.write_table(pa.table({"x": flat, "y": y}), os.path.join(tmp, "rows.parquet"))
        try:
            MirroredStrategyRunner(num_slots=PROCS, use_gpu=False).run(
                mirrored_strategy, path=tmp, epochs=1
            )
            result = {"ok": True, "error": None}
        except Exception as e:  # noqa: BLE001 - the probe records what the user would see
            lines = [ln for ln in str(e).splitlines() if ln.startswith(("ValueError", "TypeError"))]
            result = {"ok": False, "error": (lines or [str(e).splitlines()[0]])[0][:160]}
    result["keras"] = compat.keras_version()
    print("PROBE " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        return _probe()
    probe = keras3_probe()
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TF loads, here and in Spark's workers

    from spark_tensorflow_distributor import MirroredStrategyRunner

    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.keras import compat
    from hvdrunner.spark import local_session

    spark = local_session(f"local[{PROCS}]", app_name="bench-tf-distribute")
    spark.sparkContext.setLogLevel("ERROR")
    x, y = _task(args.rows + HELD_OUT)
    with tempfile.TemporaryDirectory() as tmp:
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.FixedSizeListArray.from_arrays(pa.array(x[: args.rows].reshape(-1)), 784)
        pq.write_table(
            pa.table({"x": flat, "y": y[: args.rows]}), os.path.join(tmp, "rows.parquet")
        )
        data = prepare(spark.read.parquet(tmp), features="x", label="y",
                       cache_dir="/tmp/hvdrunner-bench-tfd", refresh=True)  # fmt: skip
    rows = data.steps_per_epoch(BATCH, PROCS) * BATCH * PROCS
    runner = HorovodRunner(np=PROCS)
    distributor = MirroredStrategyRunner(num_slots=PROCS, use_gpu=False)
    contenders = {
        "hvdrunner_keras_fit": lambda: runner.run(hvdrunner_fit, data=data, epochs=args.epochs),
        "hvdrunner_keras_fit_compiled_horovod": lambda: _compiled(
            lambda: runner.run(hvdrunner_fit, data=data, epochs=args.epochs)
        ),
        "hvd_keras_recipe": lambda: runner.run(
            hvd_keras_recipe, path=data.local_path, epochs=args.epochs
        ),  # fmt: skip
        "mirrored_strategy_runner": lambda: distributor.run(
            mirrored_strategy, path=data.local_path, epochs=args.epochs
        ),  # fmt: skip
    }
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    for _ in range(args.reps):
        for name, call in contenders.items():
            t = time.time()
            out = call()
            out["wall"], out["to_first_line"] = time.time() - t, out["started"] - t
            out["accuracy"] = _accuracy(out.pop("weights"), x[args.rows :], y[args.rows :])
            runs[name].append(out)
    summary = {name: _summary(r, rows) for name, r in runs.items()}
    tfd = summary["mirrored_strategy_runner"]
    out = {
        "what": (
            f"{args.rows} rows x 784 float32 (y = argmax((x - 0.5) W), 10 classes), MLP 784-256-10, Adam "
            f"lr {LR}, batch {BATCH}/process (global {BATCH * PROCS}), {args.epochs} epochs, "
            f"{PROCS} processes on local[{PROCS}], medians of {args.reps} interleaved reps; "
            f"rows_per_s/step_ms over epochs 2..{args.epochs}; launch_s = wall minus the epochs; "
            f"held_out_accuracy on {HELD_OUT} rows not trained on"
        ),
        **summary,
        "fit_vs_tf_distribute_throughput": round(
            summary["hvdrunner_keras_fit"]["rows_per_s"] / tfd["rows_per_s"], 3),
        "recipe_vs_tf_distribute_throughput": round(
            summary["hvd_keras_recipe"]["rows_per_s"] / tfd["rows_per_s"], 3),
        "fit_engine_vs_compiled_horovod_throughput": round(
            summary["hvdrunner_keras_fit"]["rows_per_s"]
            / summary["hvdrunner_keras_fit_compiled_horovod"]["rows_per_s"], 3),
        "fit_vs_tf_distribute_launch": round(
            summary["hvdrunner_keras_fit"]["launch_s"] / tfd["launch_s"], 3),
        "keras": compat.keras_version(),
        "mirrored_strategy_runner_under_keras3": probe,
        **context(),
    }  # fmt: skip
    save(RESULTS / f"tf_distribute_comparison-{stack()}.json", out)  # modern, in tf_keras mode
    data.delete()
    spark.stop()


if __name__ == "__main__":
    main()
