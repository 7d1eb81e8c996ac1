"""The Keras step of ``make gpu-check`` (benchmarks/gpu_check.py runs it with a TensorFlow
stack's interpreter): ``hvdrunner.keras.fit`` of gpu_check's MLP on the same synthetic rows,
on driver ranks; prints one JSON line: wall, rows/s over the whole fit, and the devices
TensorFlow saw (its pip build sees GPUs only with its CUDA libraries installed).

    .venv-18/bin/python benchmarks/gpu_check_keras.py --ranks 1 --epochs 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from gpu_check import BATCH, CLASSES, FEATURES, _data


def build_keras() -> Any:
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1024, activation="relu"),
        tf.keras.layers.Dense(1024, activation="relu"), tf.keras.layers.Dense(CLASSES),
    ])  # fmt: skip


def keras_fit_job(data: Any, epochs: int) -> dict[str, Any] | None:
    import tensorflow as tf

    import hvdrunner.keras as hk

    start = time.perf_counter()
    result = hk.fit(build_keras, data, epochs=epochs, batch_size=BATCH, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"], log_model=False, verbose=0)  # fmt: skip
    if result is None:
        return None
    wall = time.perf_counter() - start
    rows = result.steps_per_epoch * BATCH * result.num_ranks * epochs
    return {"wall_s": round(wall, 2), "rows_per_s_whole_fit": round(rows / wall),
            "accuracy": result.history["accuracy"][-1],
            "tf_gpus": [d.name for d in tf.config.list_physical_devices("GPU")]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16384)
    args = parser.parse_args()
    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    spark = local_session(f"local[{max(2, args.ranks)}]", app_name="hvdrunner-gpu-check-keras")
    data = _data(spark, str(Path(".hvdrunner") / "gpu-check-cache"), args.rows)
    out = HorovodRunner(np=-args.ranks).run(keras_fit_job, data=data, epochs=args.epochs)
    spark.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
