"""The measurements of ``make gpu-check`` (scripts/gpu_check.sh), in one process tree:

Steps 1-3 run once per PyTorch engine: hvdrunner's (``hvdrunner.hvd_torch`` on
torch.distributed, NCCL on GPUs) and, where it imports, the compiled ``horovod.torch``.

1. **pinning**: HorovodRunner ranks on the driver (np<0), one per GPU; each reports the
   ``CUDA_VISIBLE_DEVICES`` hvdrunner gave it and the PCI bus id of its device (distinct ids
   prove one GPU per rank; NCCL itself refuses two ranks on one GPU);
2. **allreduce**: the engine's ``allreduce`` of a 64 MiB float32 tensor on each rank's device, checked
   against the exact sum, then timed (``nccl_built()`` must be true on GPUs); bus bandwidth
   = 2(n-1)/n x bytes / time, as nccl-tests reports it;
3. **torch fit**: ``hvdrunner.torch.fit`` of an MLP 784-1024-1024-10 on synthetic rows,
   rows/s over epochs 2..E;
4. **keras fit** (with ``--keras-python``, a TensorFlow stack's interpreter): the same model
   through ``hvdrunner.keras.fit``, rows/s and the device TensorFlow used.

``--device cpu`` runs the same steps on 2 CPU ranks over gloo (tests/test_gpu_wheel.py runs it
on the gpu stack, so the script a GPU machine runs once has run here).

    .venv-gpu/bin/python benchmarks/gpu_check.py --device cuda --out benchmarks/results/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FEATURES, CLASSES, BATCH = 784, 10, 256


def _ranks(device: str) -> int:
    if device == "cpu":
        return 2
    import torch

    return max(1, torch.cuda.device_count())


def allreduce_job(device: str, mib: int, iters: int) -> dict[str, Any]:
    """One rank: pinning facts, then a checked and timed allreduce."""
    import torch

    import hvdrunner.torch as ht
    from hvdrunner.torch.collectives import engine_module

    hvd = engine_module()  # the engine HVDRUNNER_TORCH_ENGINE names (main() sets it per run)
    dev = ht.init()  # hvd.init(), this rank's GPU (hvdrunner's pinning), seeds, threads
    if device == "cpu":
        dev = torch.device("cpu")
    n, size = mib * 2**20 // 4, hvd.size()
    x = torch.full((n,), float(hvd.rank() + 1), device=dev)
    total = hvd.allreduce(x, op=hvd.Sum, name="check")
    correct = bool(torch.all(total == size * (size + 1) / 2).item())
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for i in range(iters):
        hvd.allreduce(x, op=hvd.Sum, name=f"timed.{i}")
    sync()
    seconds = (time.perf_counter() - start) / iters
    facts = hvd.allgather_object({
        "rank": hvd.rank(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": str(dev), "correct": correct,
        "pci_bus_id": torch.cuda.get_device_properties(dev).pci_bus_id if dev.type == "cuda" else None,
        "name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    })  # fmt: skip
    nbytes = n * 4
    return {
        "ranks": facts, "nccl_built": bool(hvd.nccl_built()), "tensor_mib": mib,
        "seconds": seconds, "bus_gbytes_per_s": 2 * (size - 1) / size * nbytes / seconds / 1e9 if size > 1 else None,
    }  # fmt: skip


def _data(spark: Any, cache: str, rows: int) -> Any:
    import numpy as np
    import pandas as pd

    from hvdrunner.data import prepare

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = (x[:, :CLASSES].argmax(axis=1)).astype("int64")
    frame = spark.createDataFrame(pd.DataFrame({"x": x.tolist(), "y": y}))
    return prepare(frame, features="x", label="y", cache_dir=cache)


def build_torch() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, CLASSES),
    )  # fmt: skip


def torch_fit_job(data: Any, epochs: int) -> dict[str, Any] | None:
    """``hvdrunner.torch.fit``, with the training part of each epoch timed (as
    benchmarks/torch_comparison.py times it)."""
    import hvdrunner.torch as ht
    from hvdrunner.torch import loop

    times: list[float] = []
    original = loop.Trainer._train_epoch

    def timed(self: Any, feed: Any, epoch: int) -> Any:
        t = time.perf_counter()
        out = original(self, feed, epoch)
        times.append(time.perf_counter() - t)
        return out

    loop.Trainer._train_epoch = timed  # type: ignore[method-assign]
    start = time.perf_counter()
    result = ht.fit(build_torch, data, epochs=epochs, batch_size=BATCH, loss="cross_entropy",
                    metrics=["accuracy"], log_model=False, verbose=0)  # fmt: skip
    if result is None:
        return None
    rows = result.steps_per_epoch * BATCH * result.num_ranks
    steady = times[1:] or times  # epoch 1 warms up
    return {"wall_s": round(time.perf_counter() - start, 2), "epoch_s": [round(t, 3) for t in times],
            "rows_per_s": round(rows / (sum(steady) / len(steady))),
            "accuracy": result.history["accuracy"][-1]}  # fmt: skip


def _engines() -> list[str]:
    """hvdrunner's engine always; the compiled horovod.torch too where it imports."""
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        return ["hvdrunner"]
    return ["hvdrunner", "horovod"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rows", type=int, default=16384, help="synthetic rows for the fits")
    parser.add_argument("--keras-python", help="a TensorFlow stack's python for the Keras fit")
    parser.add_argument("--out", help="results JSON (default: print only)")
    args = parser.parse_args()
    from hvdrunner import HorovodRunner, _versions
    from hvdrunner.spark import local_session

    ranks = _ranks(args.device)
    out: dict[str, Any] = {"device": args.device, "ranks": ranks, "engines": {}}
    spark = local_session(f"local[{max(2, ranks)}]", app_name="hvdrunner-gpu-check")
    data = _data(spark, str(Path(".hvdrunner") / "gpu-check-cache"), args.rows)
    for engine in _engines():
        os.environ[_versions.ENGINE_ENV] = engine  # the ranks inherit it (framework_env)
        runs: dict[str, Any] = {"allreduce": HorovodRunner(np=-ranks).run(
            allreduce_job, device=args.device, mib=args.mib, iters=10)}  # fmt: skip
        print(engine, json.dumps(runs["allreduce"], indent=1), flush=True)
        if not all(r["correct"] for r in runs["allreduce"]["ranks"]):
            print(f"ERROR: allreduce on the {engine} engine gave a wrong sum", file=sys.stderr)
            return 1
        runs["torch_fit"] = HorovodRunner(np=-ranks).run(
            torch_fit_job, data=data, epochs=args.epochs
        )
        print(engine, json.dumps(runs["torch_fit"]), flush=True)
        out["engines"][engine] = runs
    if args.keras_python:  # its own interpreter: the gpu stack has no TensorFlow
        proc = subprocess.run([args.keras_python, str(Path(__file__).parent / "gpu_check_keras.py"),
                               "--ranks", str(ranks), "--epochs", str(args.epochs),
                               "--rows", str(args.rows)],
                              capture_output=True, text=True, timeout=420)  # fmt: skip
        out["keras_fit"] = (json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0
                            else {"error": proc.stderr[-2000:]})  # fmt: skip
        print(json.dumps(out["keras_fit"]), flush=True)
    spark.stop()
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
