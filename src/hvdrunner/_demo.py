"""The local demo behind ``make demo``: a real 2-rank Keras fit over local Spark.

Stands in until the notebooks (01 prepare → 02 train → 03 score) drive the demo. Data is
scikit-learn's bundled ``load_digits`` (1,797 8×8 images, no download). Each rank trains on
its own slice; gradients are averaged by ``hvd.DistributedOptimizer``; rank 0 evaluates and
returns the history. The driver logs params and metrics to a local MLflow store.
"""

from __future__ import annotations

import time
from typing import Any


def train_digits(
    epochs: int, batch_size: int, learning_rate: float, seed: int = 0
) -> dict[str, Any]:
    """Runs on every rank: the standard Horovod Keras recipe on one shard of digits."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from hvdrunner.distributed import is_rank0

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    tf.keras.utils.set_random_seed(seed)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    # Equal rows per rank so every rank runs the same number of steps (else: a hang).
    per_rank = len(x_train) // hvd.size()
    lo = hvd.rank() * per_rank
    x_shard, y_shard = x_train[lo : lo + per_rank], y_train[lo : lo + per_rank]
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(learning_rate * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(
        x_shard,
        y_shard,
        batch_size=batch_size,
        epochs=epochs,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),  # history = mean over ranks
        ],
        verbose=2 if is_rank0() else 0,
    )
    _, test_acc = model.evaluate(x_test, y_test, verbose=0)
    return {
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "test_accuracy": float(test_acc),
        "rows_per_rank": per_rank,
    }


def run_demo(np: int, epochs: int, master: str, tracking_uri: str) -> int:
    """Driver side of ``make demo``; returns the process exit code."""
    import mlflow

    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    t0 = time.monotonic()
    print(f"[demo] 1/3 starting Spark ({master})", flush=True)
    spark = local_session(master, app_name="hvdrunner-demo")
    spark.sparkContext.setLogLevel("ERROR")
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("hvdrunner-demo")
    params = {"np": np, "epochs": epochs, "batch_size": 32, "learning_rate": 1e-3}
    print(f"[demo] 2/3 training on {np} Horovod ranks (rank 0's Keras output below)", flush=True)
    with mlflow.start_run(run_name="digits-demo") as run:
        mlflow.log_params(params)
        result = HorovodRunner(np=np, driver_log_verbosity="all").run(
            train_digits, epochs=epochs, batch_size=32, learning_rate=1e-3
        )
        for name, values in result["history"].items():
            for step, value in enumerate(values):
                mlflow.log_metric(name, value, step=step)
        mlflow.log_metric("test_accuracy", result["test_accuracy"])
    spark.stop()
    print(f"[demo] 3/3 done in {time.monotonic() - t0:.0f}s", flush=True)
    print(
        f"test accuracy: {result['test_accuracy']:.3f}  ({result['rows_per_rank']} training rows per rank)"
    )
    print(f"MLflow run id: {run.info.run_id}")
    print(f"view it:       mlflow ui --backend-store-uri {tracking_uri}")
    return 0
