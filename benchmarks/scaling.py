"""Weak scaling of gradient exchange on this machine: np=1 and np=2 driver-process ranks.

MLP 784-1024-1024-10 (1.9 M params), batch 128 per rank, the same steps per epoch on every
rank, 1 TF thread per rank, in-memory data (no input pipeline: this isolates the exchange).
For each np it times steady epochs of:

- ``no_exchange``: each rank trains alone (no DistributedOptimizer): the CPUs' own limit;
- ``allreduce``: ``hvdrunner.hvd_keras.DistributedOptimizer`` (float32 gradients);
- ``allreduce_fp16``: the same with ``compression=Compression.fp16`` (half the bytes);

and, separately, one grouped allreduce of the model's gradient tensors (the exchange alone).
Efficiency = throughput with exchange / throughput without, at the same np, same run.
Results: ``benchmarks/results/scaling-<keras mode>.json``.

    .venv-modern/bin/python benchmarks/scaling.py [--steps 48 --epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
BATCH = 128


def worker(variant: str, steps: int, epochs: int) -> dict:
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import hvdrunner.hvd_keras as hvd

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(steps * BATCH, 784)).astype("float32")
    y = rng.integers(0, 10, size=steps * BATCH).astype("int32")
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(784,)), tf.keras.layers.Dense(1024, activation="relu"),
        tf.keras.layers.Dense(1024, activation="relu"), tf.keras.layers.Dense(10),
    ])  # fmt: skip
    opt = tf.keras.optimizers.SGD(0.01)
    if variant != "no_exchange":
        compression = hvd.Compression.fp16 if variant == "allreduce_fp16" else hvd.Compression.none
        opt = hvd.DistributedOptimizer(opt, compression=compression)
    model.compile(
        optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    marks: list[float] = []

    class Clock(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            marks.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            marks.append(time.perf_counter())

    cbs = [Clock()] + (
        [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if variant != "no_exchange" else []
    )
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=cbs)
    epoch_s = [marks[i + 1] - marks[i] for i in range(0, len(marks), 2)][1:]  # steady epochs
    out = {"epoch_s": epoch_s}
    if variant == "allreduce":  # the exchange alone: one grouped allreduce of all gradients
        grads = [tf.ones_like(v) for v in model.trainable_variables]
        import horovod.tensorflow as hvd_tf

        for _ in range(3):
            hvd_tf.grouped_allreduce(grads, op=hvd_tf.Average)
        t = time.perf_counter()
        for _ in range(10):
            hvd_tf.grouped_allreduce(grads, op=hvd_tf.Average)
        out["allreduce_s"] = (time.perf_counter() - t) / 10
        out["grad_bytes"] = int(sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables))
    return hvd.allgather_object(out)[0] | {"np": hvd.size()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from hvdrunner import HorovodRunner
    from hvdrunner.keras import compat

    rows = []
    for np_ in (1, 2):
        for variant in ("no_exchange", "allreduce", "allreduce_fp16"):
            if np_ == 1 and variant == "allreduce_fp16":
                continue
            r = HorovodRunner(np=-np_).run(
                worker, variant=variant, steps=args.steps, epochs=args.epochs
            )
            epoch = statistics.median(r["epoch_s"])
            row = {"np": np_, "variant": variant, "samples_per_s": round(np_ * BATCH * args.steps / epoch),
                   "step_ms": round(1000 * epoch / args.steps, 1)}  # fmt: skip
            if "allreduce_s" in r:
                row["allreduce_alone_ms"] = round(1000 * r["allreduce_s"], 1)
                row["grad_mb"] = round(r["grad_bytes"] / 1e6, 2)
                if np_ > 1:  # a ring allreduce sends 2(n-1)/n of the bytes per rank
                    sent = 2 * (np_ - 1) / np_ * r["grad_bytes"]
                    row["effective_gb_per_s"] = round(sent / r["allreduce_s"] / 1e9, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    by = {(r["np"], r["variant"]): r for r in rows}
    limit = by[(2, "no_exchange")]["samples_per_s"]
    out = {
        "what": f"weak scaling, MLP 784-1024-1024-10, batch {BATCH}/rank, {args.steps} steps/epoch, "
        f"median of steady epochs ({args.epochs - 1}), 1 TF thread per rank, in-memory data",
        "keras": f"{compat.mode()} {compat.keras_version()}",
        "rows": rows,
        "efficiency_vs_no_exchange_np2": {
            v: round(by[(2, v)]["samples_per_s"] / limit, 3)
            for v in ("allreduce", "allreduce_fp16")
        },
        "cpu_scaling_np2_over_np1": round(limit / (2 * by[(1, "no_exchange")]["samples_per_s"]), 3),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"scaling-{compat.mode()}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
