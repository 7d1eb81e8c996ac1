"""PyTorch, side by side in one run on the same ranks and data (torch stack, local[2]):

1. ``hvdrunner.torch.fit`` (and fit with its gradient buckets off, and with
   ``HOROVOD_IDLE_WAIT_MS=0``) against a bare ``horovod.torch`` loop (the standard recipe:
   DistributedSampler, DataLoader, DistributedOptimizer; under HorovodRunner's default
   Horovod settings and with horovod's stock rounds), all under HorovodRunner(np=2):
   steady training throughput (rows/s over epochs 2..E; epoch 1 warms up). Goal >= 0.97x.
2. HorovodRunner against pyspark's ``TorchDistributor`` (the runner Spark users pick for
   PyTorch; torch.distributed DDP over gloo) for the same 2-process job on Spark barrier
   tasks: launch wall (call -> both processes training, i.e. wall minus the time inside the
   function) and steady step time.

Data: N rows x 784 float32 features (synthetic, 10 classes), prepared once as Parquet; the
model an MLP 784-256-10, batch 64 per process, SGD. Results in
benchmarks/results/torch_comparison-torch.json.

    .venv-19/bin/python benchmarks/torch_comparison.py [--rows 40000 --epochs 5 --reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _bench import context, save

RESULTS = Path(__file__).parent / "results" / "torch_comparison-torch.json"
BATCH = 64


def build():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def _shard_arrays(local_path: str):
    """Every row of the prepared files, as the bare loop's user would load them (the
    DistributedSampler then gives each process its share)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(local_path, columns=["x", "y"])
    x = pc.list_flatten(table["x"].combine_chunks()).to_numpy().reshape(-1, 784)
    return x.astype("float32"), table["y"].to_numpy().astype("int64")


def _epochs_timed(run_epoch, epochs: int) -> list[float]:
    out = []
    for e in range(epochs):
        t = time.perf_counter()
        run_epoch(e)
        out.append(time.perf_counter() - t)
    return out


def bare_horovod(local_path: str, epochs: int, stock: bool = False, buckets: bool = False):
    """The standard horovod.torch recipe; returns (seconds per epoch, steps, start time).
    Unchanged, it runs with HorovodRunner's default Horovod settings
    (``HOROVOD_IDLE_WAIT_MS=20``); ``stock``: ``HOROVOD_IDLE_WAIT_MS=0`` first (horovod's own
    rounds, HorovodRunner before that default); ``buckets``: the recipe's two-line change to
    fit's exchange (``HOROVOD_IDLE_WAIT_MS=20``, ``groups=hvdrunner.torch.buckets(model)``)."""
    started = time.time()
    import os

    if stock or buckets:
        os.environ["HOROVOD_IDLE_WAIT_MS"] = "0" if stock else "20"
    import horovod.torch as hvd
    import torch

    from hvdrunner.torch.collectives import buckets as bucketed

    hvd.init()
    torch.set_num_threads(max(1, torch.get_num_threads() // hvd.local_size()))
    x, y = _shard_arrays(local_path)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, hvd.size(), hvd.rank())
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
    model = build()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                   named_parameters=model.named_parameters(),
                                   groups=bucketed(model) if buckets else None)  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), 0)
    hvd.broadcast_optimizer_state(opt, 0)

    def epoch(e: int) -> None:
        sampler.set_epoch(e)
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()

    return _epochs_timed(epoch, epochs), len(loader), started


def hvdrunner_fit(data, epochs: int, grouped: bool = True, idle_wait: bool = True):
    """hvdrunner.torch.fit on the same job; epoch times measured around fit's own loop.
    ``grouped=False``: one allreduce request per gradient (``bucket_cap_mb=0``), still with
    ``HOROVOD_IDLE_WAIT_MS=20``; ``idle_wait=False``: ``HOROVOD_IDLE_WAIT_MS=0``, horovod's
    stock every-cycle rounds."""
    started = time.time()
    import os

    from hvdrunner import _horovod_knobs
    from hvdrunner.torch import fit, loop
    from hvdrunner.torch.config import BUCKET_CAP_MB

    # HorovodRunner (and fit, with buckets) set HOROVOD_IDLE_WAIT_MS=20; set here, it is what
    # each variant says
    os.environ[_horovod_knobs.IDLE_WAIT_ENV] = _horovod_knobs.IDLE_WAIT_MS if idle_wait else "0"

    times: list[float] = []
    original = loop.Trainer._train_epoch

    def timed(self, feed, epoch):  # the training part of an epoch, as in the bare loop
        t = time.perf_counter()
        out = original(self, feed, epoch)
        times.append(time.perf_counter() - t)
        return out

    loop.Trainer._train_epoch = timed
    result = fit(build_model=build, data=data, epochs=epochs, batch_size=BATCH, loss="cross_entropy",
                 optimizer="sgd", learning_rate=0.01, log_model=False, verbose=0,
                 bucket_cap_mb=BUCKET_CAP_MB if grouped else 0)  # fmt: skip
    return times, data.steps_per_epoch(BATCH), started, result is not None


def ddp_loop(local_path: str, epochs: int):
    """The same job in torch.distributed DDP (gloo), as TorchDistributor runs it."""
    started = time.time()
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // size))
    x, y = _shard_arrays(local_path)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, size, rank)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * size)

    def epoch(e: int) -> None:
        sampler.set_epoch(e)
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()

    times = _epochs_timed(epoch, epochs)
    dist.destroy_process_group()
    return times, len(loader), started


def idle_cpu(idle_wait_ms: str, seconds: float = 4.0) -> float:
    """Percent of a core one rank's process spends while its job does nothing at all
    (horovod's background rounds), with ``HOROVOD_IDLE_WAIT_MS`` as given."""
    import os

    os.environ["HOROVOD_IDLE_WAIT_MS"] = idle_wait_ms
    import horovod.torch as hvd

    hvd.init()
    hvd.allreduce(__import__("torch").zeros(1), name="warm")
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(seconds)
    return round(100 * (time.process_time() - cpu) / (time.monotonic() - wall), 1)


def _summary(runs: list[tuple[float, list[float], int, float]], rows_per_epoch: int) -> dict:
    """runs: (wall, epoch seconds, steps, seconds from call to function start)."""
    steady = [statistics.median(t[1:]) for _, t, _, _ in runs]
    steps = runs[0][2]
    return {
        "rows_per_s": round(rows_per_epoch / statistics.median(steady)),
        "step_ms": round(1000 * statistics.median(steady) / steps, 2),
        "steps_per_epoch": steps,
        "wall_s": round(statistics.median(w for w, _, _, _ in runs), 2),
        "launch_s": round(statistics.median(w - sum(t) for w, t, _, _ in runs), 2),
        "to_first_line_s": round(statistics.median(s for _, _, _, s in runs), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import functions as F

    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="bench-torch")
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(args.rows).select(
        F.transform(F.sequence(F.lit(1), F.lit(784)),
                    lambda i: ((F.col("id") * i) % 997).cast("float") / 997).alias("x"),
        (F.col("id") % 10).cast("long").alias("y"),
    )  # fmt: skip
    data = prepare(
        df, features="x", label="y", cache_dir="/tmp/hvdrunner-bench-torch", refresh=True
    )
    rows = data.steps_per_epoch(BATCH, 2) * BATCH * 2

    def timed(call):
        t = time.time()
        times, steps, started, *_ = call()
        return time.time() - t, times, steps, started - t

    runner = HorovodRunner(np=2)
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    path, epochs = data.local_path, args.epochs
    contenders = {
        "fit": lambda: runner.run(hvdrunner_fit, data=data, epochs=epochs),
        "fit_ungrouped": lambda: runner.run(hvdrunner_fit, data=data, epochs=epochs, grouped=False),
        "fit_no_idle_wait": lambda: runner.run(
            hvdrunner_fit, data=data, epochs=epochs, idle_wait=False
        ),  # fmt: skip
        "bare": lambda: runner.run(bare_horovod, local_path=path, epochs=epochs),
        "bare_stock": lambda: runner.run(bare_horovod, local_path=path, epochs=epochs, stock=True),
        "bare_buckets": lambda: runner.run(
            bare_horovod, local_path=path, epochs=epochs, buckets=True
        ),  # fmt: skip
        "ddp": lambda: distributor.run(ddp_loop, path, epochs),
    }
    results: dict[str, list] = {name: [] for name in contenders}
    for _ in range(args.reps):  # interleaved, so drift hits all alike
        for name, call in contenders.items():
            results[name].append(timed(call))
    summary = {k: _summary(v, rows) for k, v in results.items()}
    idle = {f"idle_wait_ms_{ms}": runner.run(idle_cpu, idle_wait_ms=ms) for ms in ("0", "20")}
    out = {
        "what": (
            f"{args.rows} rows x 784 float32, MLP 784-256-10, batch {BATCH}/process, SGD, "
            f"{args.epochs} epochs, 2 processes on local[2], medians of {args.reps} interleaved "
            f"reps; rows_per_s/step_ms over epochs 2..{args.epochs}; launch_s = wall minus "
            f"the epochs; to_first_line_s = call until the function's first line"
        ),
        "hvdrunner_torch_fit": summary["fit"],
        "hvdrunner_torch_fit_ungrouped": summary["fit_ungrouped"],
        "hvdrunner_torch_fit_no_idle_wait": summary["fit_no_idle_wait"],
        "bare_horovod_torch": summary["bare"],
        "bare_horovod_torch_stock_rounds": summary["bare_stock"],
        "bare_horovod_torch_buckets_idle_wait": summary["bare_buckets"],
        "torch_distributor_ddp": summary["ddp"],
        "idle_rank_cpu_percent": idle,
        "fit_vs_bare_throughput": round(summary["fit"]["rows_per_s"] / summary["bare"]["rows_per_s"], 3),
        "bare_vs_ddp_throughput": round(summary["bare"]["rows_per_s"] / summary["ddp"]["rows_per_s"], 3),
        "bare_stock_vs_ddp_throughput": round(
            summary["bare_stock"]["rows_per_s"] / summary["ddp"]["rows_per_s"], 3),
        "bare_buckets_vs_ddp_throughput": round(
            summary["bare_buckets"]["rows_per_s"] / summary["ddp"]["rows_per_s"], 3),
        "fit_vs_ddp_throughput": round(summary["fit"]["rows_per_s"] / summary["ddp"]["rows_per_s"], 3),
        "horovodrunner_vs_torchdistributor_launch": round(
            summary["bare"]["launch_s"] / summary["ddp"]["launch_s"], 3),
        "horovod_vs_ddp_step_time": round(summary["bare"]["step_ms"] / summary["ddp"]["step_ms"], 3),
        **context(),
    }  # fmt: skip
    save(RESULTS, out)
    data.delete()
    spark.stop()


if __name__ == "__main__":
    main()
