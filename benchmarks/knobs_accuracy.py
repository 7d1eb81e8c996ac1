"""What each gradient-exchange knob does to the digits demo's accuracy (and its epoch time).

The demo's training (``notebooks/02_train_keras.py`` defaults: np=2, 10 epochs, batch 32
per rank, Adam at 0.001 x ranks, 2 warmup epochs, the demo's MLP) on scikit-learn's digits,
80/20 split with seed 0, once per knob. The held-out accuracy is ``fit``'s ``val_accuracy``
after the last epoch (every rank evaluates its equal share of the test rows; averaged).
Results: ``benchmarks/results/knobs_accuracy-<stack>.json``.

    .venv-18/bin/python benchmarks/knobs_accuracy.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _bench import context

RESULTS = Path(__file__).parent / "results"
KNOBS = {
    "default": {},
    "compression=fp16": {"compression": "fp16"},
    "backward_passes_per_step=2": {"backward_passes_per_step": 2},
    "backward_passes_per_step=4": {"backward_passes_per_step": 4},
    "fusion_threshold_mb=0": {"fusion_threshold_mb": 0},
    "cycle_time_ms=5": {"cycle_time_ms": 5},
}


def build_model():
    """The demo's model, as in notebooks/02_train_keras.py."""
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input(shape=(64,)), tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])  # fmt: skip


def timed_fit(**kwargs) -> dict:
    from hvdrunner.keras import compat, fit

    keras = compat.keras_module()
    marks: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            marks.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            marks.append(time.perf_counter())

    result = fit(callbacks=[Clock()], **kwargs)
    epochs = [marks[i + 1] - marks[i] for i in range(0, len(marks), 2)][1:]
    return {"history": result.history if result else None, "epoch_s": statistics.median(epochs)}


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.examples.datasets import load_digits_df
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="bench-knobs")
    spark.sparkContext.setLogLevel("ERROR")
    train, test = load_digits_df(spark).randomSplit([0.8, 0.2], seed=0)
    cache = tempfile.mkdtemp(prefix="hvdrunner-bench-knobs-")
    try:
        train_data = prepare(train, features="pixels", label="label", cache_dir=cache)
        test_data = prepare(test, features="pixels", label="label", cache_dir=cache)
        rows = []
        for name, knob in KNOBS.items():
            out = HorovodRunner(np=2).run(
                timed_fit, build_model=build_model, data=train_data, validation=test_data,
                epochs=10, batch_size=32, learning_rate=1e-3, warmup_epochs=2,
                loss="sparse_categorical_crossentropy", metrics=["accuracy"], log_model=False,
                verbose=0, **knob,
            )  # fmt: skip
            h = out["history"]
            row = {"knob": name, "test_accuracy": round(h["val_accuracy"][-1], 4),
                   "train_loss": round(h["loss"][-1], 4),
                   "epoch_ms": round(1000 * out["epoch_s"])}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        spark.stop()
    result = {
        "what": "digits demo training, np=2 (Spark local[2] barrier tasks), 10 epochs, batch "
        "32/rank, Adam 1e-3 x 2, 2 warmup epochs; held-out accuracy after epoch 10; median "
        "steady epoch time",
        "rows": rows,
        **context(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"knobs_accuracy-{result['stack']}.json").write_text(
        json.dumps(result, indent=2) + "\n"
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
