"""Keras on PyTorch against Keras on TensorFlow and ``hvdrunner.torch.fit``, side by side.

The same job for each contender - an MLP 784-256-10 on N synthetic rows x 784 float32
features (10 classes) prepared once as Parquet, batch 64 per rank, SGD, 2 ranks under
``HorovodRunner(np=2)`` on ``local[2]``:

- ``keras-torch``: ``hvdrunner.keras.fit`` with ``KERAS_BACKEND=torch`` (the torch stack's
  venv: Keras 3, no TensorFlow);
- ``keras-tf``: ``hvdrunner.keras.fit`` on TensorFlow (the modern stack's venv);
- ``torch-fit``: ``hvdrunner.torch.fit`` (the torch stack's venv).

What a user waits for: an epoch's wall time, as the difference between an E-epoch job and a
1-epoch job divided by E - 1 (each the wall of ``HorovodRunner.run``, launch included, so the
epoch figure carries every per-epoch cost: metric averaging, logging, the feed's next pass).
Each job runs in its own process; the contenders are interleaved, rotated per repetition,
medians reported. Results in benchmarks/results/keras_backends.json.

    .venv-19/bin/python benchmarks/keras_backends.py [--rows 20000 --epochs 5 --reps 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "keras_backends.json"
ROOT = Path(__file__).resolve().parents[1]
BATCH = 64
#: contender -> (venv, KERAS_BACKEND)
CONTENDERS = {
    "keras-torch": (".venv-19", "torch"),
    "keras-tf": (".venv-18", "tensorflow"),
    "torch-fit": (".venv-19", None),
}


def keras_model():
    import keras

    return keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(10)])  # fmt: skip


def torch_model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def one_job(contender: str, rows: int, epochs: int, cache: str) -> float:
    """The wall seconds of one ``HorovodRunner.run`` of the contender's fit (this process)."""
    from pyspark.sql import functions as F

    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="keras-backends")
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(rows).select(  # torch_comparison.py's synthetic rows
        F.transform(F.sequence(F.lit(1), F.lit(784)),
                    lambda i: ((F.col("id") * i) % 997).cast("float") / 997).alias("x"),
        (F.col("id") % 10).cast("long").alias("y"),
    )  # fmt: skip
    data = prepare(df, features="x", label="y", cache_dir=cache)
    common = dict(data=data, epochs=epochs, batch_size=BATCH, optimizer="sgd", learning_rate=0.01,
                  log_model=False, verbose=0)  # fmt: skip
    if contender == "torch-fit":
        from hvdrunner.torch import fit

        job = dict(fit=fit, build_model=torch_model, loss="cross_entropy")
    else:
        import keras

        from hvdrunner.keras import fit

        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        job = dict(fit=fit, build_model=keras_model, loss=loss)
    started = time.perf_counter()
    HorovodRunner(np=2).run(job.pop("fit"), **job, **common)
    wall = time.perf_counter() - started
    spark.stop()
    return wall


def _spawn(contender: str, rows: int, epochs: int, cache: str) -> float:
    venv, backend = CONTENDERS[contender]
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    if backend:
        env["KERAS_BACKEND"] = backend
    python = str(ROOT / venv / "bin" / "python")
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = python
    out = subprocess.run(
        [python, __file__, "--one", contender, "--rows", str(rows), "--epochs", str(epochs),
         "--cache", cache],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("WALL ")]
    if out.returncode or not lines:
        raise RuntimeError(f"{contender}: {out.stdout[-2000:]}{out.stderr[-3000:]}")
    return float(lines[-1].split()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--one", choices=sorted(CONTENDERS))
    parser.add_argument("--cache")
    args = parser.parse_args()
    if args.one:
        print(f"WALL {one_job(args.one, args.rows, args.epochs, args.cache):.3f}")
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from _bench import context, save

    names = list(CONTENDERS)
    walls: dict[str, dict[int, list[float]]] = {n: {1: [], args.epochs: []} for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                for epochs in (1, args.epochs):
                    wall = _spawn(name, args.rows, epochs, os.path.join(tmp, name))
                    walls[name][epochs].append(wall)
                    print(f"rep {rep + 1} {name} {epochs} epoch(s): {wall:.2f} s", flush=True)
    epoch_s = {n: (statistics.median(w[args.epochs]) - statistics.median(w[1])) / (args.epochs - 1)
               for n, w in walls.items()}  # fmt: skip
    rows_per_rank = -(-args.rows // 2)
    results = {
        name: {
            "epoch_s": round(epoch_s[name], 3),
            "rows_per_s": round(args.rows / epoch_s[name]),
            "job_1_epoch_s": round(statistics.median(walls[name][1]), 2),
            f"job_{args.epochs}_epochs_s": round(statistics.median(walls[name][args.epochs]), 2),
            "vs_torch_fit": round(epoch_s["torch-fit"] / epoch_s[name], 3),
        }
        for name in names
    }
    save(RESULTS, {
        "what": "whole-epoch wall time = (E-epoch job - 1-epoch job) / (E - 1), each job's "
                "HorovodRunner.run wall; MLP 784-256-10, batch 64/rank, SGD, np=2 on local[2]; "
                "interleaved, rotated per rep, medians; vs_torch_fit > 1 is faster",
        "command": f"benchmarks/keras_backends.py --rows {args.rows} --epochs {args.epochs} "
                   f"--reps {args.reps}",
        "rows": args.rows, "rows_per_rank": rows_per_rank, "epochs": args.epochs,
        "reps": args.reps, "context": context(), "results": results,
    })  # fmt: skip


if __name__ == "__main__":
    main()
