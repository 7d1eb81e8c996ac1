"""Speed as a user times it: whole jobs and whole epochs, every contender in one interleaved
run (torch stack, 2 processes on local[2], batch 64 per process, SGD).

Models: ``mlp256`` - MLP 256-512-10 over 20,000 x 256 rows; ``mlp784`` - the docs' MLP
784-256-10 over 40,000 x 784 rows (synthetic float32, 10 classes, prepared once as Parquet).

Contenders:
- ``fit``: ``hvdrunner.torch.fit`` under ``HorovodRunner(np=2)``, no MLflow run;
- ``fit_mlflow``: the same inside an MLflow run (sqlite store), as a Databricks user has one;
- ``keras_fit``: ``hvdrunner.keras.fit`` (Keras 3 on PyTorch) on the same data;
- ``bare``: the unchanged ``horovod.torch`` recipe (DistributedSampler, DataLoader,
  DistributedOptimizer) under ``HorovodRunner(np=2)``;
- ``bare_engine``: the same recipe with its import changed to ``import hvdrunner.hvd_torch
  as hvd`` (hvdrunner's engine, nothing compiled);
- ``ddp``: torch DDP (gloo) under pyspark's ``TorchDistributor(num_processes=2)``;
- ``bare_hsr``: the bare recipe under ``horovod.spark.run(num_proc=2)`` (the launch only).

What is timed: each contender's 1-epoch and E-epoch jobs, wall from the call to its return.
**Whole epoch**: what a user waits for per epoch, the epoch boundary included (metric
averaging, logging, the feed's next pass): rank 0's wall from epoch 2's first step to epoch
E's, over E - 2 epochs; and, from outside, (T(E) - T(1)) / (E - 1) over the job walls
(launch noise included: a TorchDistributor launch varies by seconds). Beside it, from inside
the function (rank 0, wall clock): the step loop alone (fit: ``Trainer._train_epoch``; the
bare loops: their ``for`` over the loader), the boundary (epoch wall minus step loop), the
first epoch, and the launch's phases: call -> the function's first line, first line ->
first step (the function's own set-up), last epoch -> return, return -> the caller has it.

    .venv-19/bin/python benchmarks/epoch_wall.py [--reps 3 --epochs 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _bench import context, save

RESULTS = Path(__file__).parent / "results" / "epoch_wall-torch.json"
BATCH = 64
MODELS = {"mlp256": (20_000, 256, 512), "mlp784": (40_000, 784, 256)}  # rows, inputs, hidden


def build(inputs: int, hidden: int):
    import torch

    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))  # fmt: skip


def build_keras(inputs: int, hidden: int):
    import keras

    return keras.Sequential([keras.Input(shape=(inputs,)),
                             keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(10)])  # fmt: skip


def _arrays(local_path: str, inputs: int):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(local_path, columns=["x", "y"])
    x = pc.list_flatten(table["x"].combine_chunks()).to_numpy().reshape(-1, inputs)
    return x.astype("float32"), table["y"].to_numpy().astype("int64")


def _loop_epochs(loader, sampler, step, epochs: int) -> list[tuple[float, float]]:
    """(start, end) of each epoch's step loop, wall clock."""
    out = []
    for e in range(epochs):
        sampler.set_epoch(e)
        t = time.time()
        for xb, yb in loader:
            step(xb, yb)
        out.append((t, time.time()))
    return out


def bare(local_path: str, inputs: int, hidden: int, epochs: int,
         engine: str = "horovod.torch") -> dict:  # fmt: skip
    """The unchanged horovod.torch recipe (``import <engine> as hvd``), timed from its first
    line."""
    first = time.time()
    import importlib

    import torch

    hvd = importlib.import_module(engine)

    hvd.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // hvd.local_size()))
    x, y = _arrays(local_path, inputs)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, hvd.size(), hvd.rank())
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                         drop_last=True)  # fmt: skip
    model = build(inputs, hidden)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                   named_parameters=model.named_parameters())  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), 0)
    hvd.broadcast_optimizer_state(opt, 0)

    def step(xb, yb):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    loops = _loop_epochs(loader, sampler, step, epochs)
    return {"first_line": first, "loops": loops, "returned": time.time()}


def ddp(local_path: str, inputs: int, hidden: int, epochs: int) -> dict:
    """The same job in torch DDP over gloo, as TorchDistributor runs it."""
    first = time.time()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // size))
    x, y = _arrays(local_path, inputs)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, size, rank)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                         drop_last=True)  # fmt: skip
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build(inputs, hidden))
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * size)

    def step(xb, yb):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    loops = _loop_epochs(loader, sampler, step, epochs)
    dist.destroy_process_group()
    return {"first_line": first, "loops": loops, "returned": time.time()}


def fit(data, inputs: int, hidden: int, epochs: int) -> dict | None:
    """hvdrunner.torch.fit, its step loops timed around ``Trainer._train_epoch``."""
    first = time.time()
    import functools

    from hvdrunner.torch import fit as torch_fit
    from hvdrunner.torch import loop

    loops: list[tuple[float, float]] = []
    original = loop.Trainer._train_epoch

    def timed(self, feed, epoch):
        t = time.time()
        out = original(self, feed, epoch)
        loops.append((t, time.time()))
        return out

    loop.Trainer._train_epoch = timed
    result = torch_fit(build_model=functools.partial(build, inputs, hidden), data=data,
                       epochs=epochs, batch_size=BATCH, loss="cross_entropy", optimizer="sgd",
                       learning_rate=0.01, log_model=False, verbose=0)  # fmt: skip
    return {
        "first_line": first,
        "loops": loops,
        "returned": time.time(),
        "rank0": result is not None,
    }


def keras_fit(data, inputs: int, hidden: int, epochs: int) -> dict | None:
    """hvdrunner.keras.fit (Keras 3 on PyTorch), its epochs timed by a callback."""
    first = time.time()
    import functools

    import keras

    from hvdrunner.keras import fit as k_fit

    loops: list[tuple[float, float]] = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.time()

        def on_train_batch_end(self, batch, logs=None):
            self.last = time.time()

        def on_epoch_end(self, epoch, logs=None):
            loops.append((self.t, self.last))

    k_fit(build_model=functools.partial(build_keras, inputs, hidden), data=data, epochs=epochs,
          batch_size=BATCH, learning_rate=0.01, optimizer="sgd", log_model=False, verbose=0,
          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
          callbacks=[Timer()])  # fmt: skip
    return {"first_line": first, "loops": loops, "returned": time.time()}


def profiled(target: str, **kwargs) -> dict | None:
    """``fit`` or ``keras_fit`` under cProfile on rank 0: where a job's time goes outside
    the step loop (the epoch boundaries and the first epoch's warm-up)."""
    import cProfile
    import io
    import pstats

    from hvdrunner.distributed import rank

    fn = {"fit": fit, "keras_fit": keras_fit}[target]
    if rank() != 0:
        fn(**kwargs)
        return None
    prof = cProfile.Profile()
    out = prof.runcall(fn, **kwargs)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(150)
    return {**(out or {}), "profile": text.getvalue()}


def _job(call) -> dict:
    """One job: its wall and rank 0's timestamps, relative to the call."""
    t = time.time()
    out = call()
    done = time.time()
    if isinstance(out, list):  # horovod.spark.run: every rank's value
        out = out[0]
    loops = out["loops"]
    return {
        "wall": done - t,
        "to_first_line": out["first_line"] - t,
        "setup": loops[0][0] - out["first_line"],
        "first_epoch": (loops[1][0] if len(loops) > 1 else out["returned"]) - loops[0][0],
        "step_loops": [b - a for a, b in loops],
        # epoch e's boundary: from its step loop's end to the next one's start
        "boundaries": [loops[i + 1][0] - loops[i][1] for i in range(len(loops) - 1)],
        "after_last_epoch": out["returned"] - loops[-1][1],
        "return_to_caller": done - out["returned"],
        "outside_epochs": (done - t) - (loops[-1][1] - loops[0][0]),
        "epoch_starts": (loops[-1][0] - loops[1][0]) / (len(loops) - 2) if len(loops) > 2 else 0,
    }


def _summary(short: list[dict], long: list[dict], epochs: int) -> dict:
    med = statistics.median
    walls = [(b["wall"] - a["wall"]) / (epochs - 1) for a, b in zip(short, long, strict=True)]
    return {
        # epochs 2..E-1, each from its first step to the next one's: its boundary included
        "whole_epoch_s": round(med(j["epoch_starts"] for j in long), 4),
        "whole_epoch_from_job_walls_s": round(med(walls), 4),
        "whole_epoch_from_job_walls_range_s": [round(min(walls), 4), round(max(walls), 4)],
        "job_1_epoch_s": round(med(j["wall"] for j in short), 3),
        f"job_{epochs}_epochs_s": round(med(j["wall"] for j in long), 3),
        "step_loop_s": round(med(med(j["step_loops"][1:]) for j in long), 4),
        "boundary_s": round(med(med(j["boundaries"][1:]) for j in long), 4),
        "first_epoch_s": round(med(j["first_epoch"] for j in long), 3),
        "to_first_line_s": round(med(j["to_first_line"] for j in long), 3),
        "setup_s": round(med(j["setup"] for j in long), 3),
        "after_last_epoch_s": round(med(j["after_last_epoch"] for j in long), 3),
        "return_to_caller_s": round(med(j["return_to_caller"] for j in long), 3),
        "launch_s": round(med(j["to_first_line"] + j["return_to_caller"] for j in long), 3),
        "outside_epochs_s": round(med(j["outside_epochs"] for j in long), 3),
    }


def _prepare(spark, rows: int, inputs: int, cache: str):
    from pyspark.sql import functions as F

    from hvdrunner.data import prepare

    df = spark.range(rows).select(
        F.transform(F.sequence(F.lit(1), F.lit(inputs)),
                    lambda i: ((F.col("id") * i) % 997).cast("float") / 997).alias("x"),
        (F.col("id") % 10).cast("long").alias("y"),
    )  # fmt: skip
    return prepare(df, features="x", label="y", cache_dir=cache, refresh=True)


def _horovod_spark():
    """horovod.spark, imported only for ``bare_hsr`` (the torch stack has no horovod)."""
    import horovod.spark

    return horovod.spark


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--contenders",
                        default="fit,fit_mlflow,keras_fit,bare,bare_engine,ddp,bare_hsr")  # fmt: skip
    parser.add_argument(
        "--profile",
        choices=["fit", "fit_mlflow", "keras_fit"],
        default=None,
        help="instead: one job of this contender under cProfile (rank 0)",
    )
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")

    import mlflow
    from pyspark.ml.torch.distributor import TorchDistributor

    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    work = tempfile.mkdtemp(prefix="hvdrunner-epoch-wall-")
    mlflow.set_tracking_uri(f"sqlite:///{work}/mlflow.db")
    spark = local_session("local[2]", app_name="bench-epoch-wall")
    spark.sparkContext.setLogLevel("ERROR")
    runner = HorovodRunner(np=2)
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)

    def in_run(call):
        with mlflow.start_run():
            return call()

    if args.profile:
        rows, inputs, hidden = MODELS[args.models.split(",")[0]]
        data = _prepare(spark, rows, inputs, f"{work}/profile")
        target = "keras_fit" if args.profile == "keras_fit" else "fit"
        call = lambda: runner.run(profiled, target=target, data=data, inputs=inputs,  # noqa: E731
                                  hidden=hidden, epochs=args.epochs)  # fmt: skip
        out = in_run(call) if args.profile == "fit_mlflow" else call()
        print(out["profile"])
        data.delete()
        spark.stop()
        return
    wanted = args.contenders.split(",")
    out: dict = {}
    for name in args.models.split(","):
        rows, inputs, hidden = MODELS[name]
        data = _prepare(spark, rows, inputs, f"{work}/{name}")
        path = data.local_path

        def jobs(e: int, data=data, path=path, inputs=inputs, hidden=hidden) -> dict:
            kw = {"inputs": inputs, "hidden": hidden, "epochs": e}
            return {
                "fit": lambda: runner.run(fit, data=data, **kw),
                "fit_mlflow": lambda: in_run(lambda: runner.run(fit, data=data, **kw)),
                "keras_fit": lambda: runner.run(keras_fit, data=data, **kw),
                "bare": lambda: runner.run(bare, local_path=path, **kw),
                "bare_engine": lambda: runner.run(bare, local_path=path,
                                                  engine="hvdrunner.hvd_torch", **kw),  # fmt: skip
                "ddp": lambda: distributor.run(ddp, path, inputs, hidden, e),
                "bare_hsr": lambda: _horovod_spark().run(bare, kwargs={"local_path": path, **kw},
                                                      num_proc=2, use_gloo=True, verbose=0),
            }  # fmt: skip

        short: dict[str, list] = {c: [] for c in wanted}
        long: dict[str, list] = {c: [] for c in wanted}
        for rep in range(args.reps):  # interleaved: drift hits every contender alike
            for c in wanted:
                short[c].append(_job(jobs(1)[c]))
                long[c].append(_job(jobs(args.epochs)[c]))
                print(f"{name} rep {rep + 1}: {c} {long[c][-1]['wall']:.2f} s", flush=True)
        summary = {c: _summary(short[c], long[c], args.epochs) for c in wanted}
        ratios = {}
        if "ddp" in summary:
            for c in ("fit", "fit_mlflow", "keras_fit", "bare", "bare_engine"):
                if c in summary:  # > 1: faster than DDP, a whole epoch as the user waits
                    ratios[f"{c}_vs_ddp_whole_epoch"] = round(
                        summary["ddp"]["whole_epoch_s"] / summary[c]["whole_epoch_s"], 3)  # fmt: skip
        if "bare_hsr" in summary:
            for c in ("bare", "bare_engine", "fit"):
                if c in summary:  # < 1: HorovodRunner launches faster
                    ratios[f"{c}_vs_horovod_spark_run_launch"] = round(
                        summary[c]["launch_s"] / summary["bare_hsr"]["launch_s"], 3)  # fmt: skip
        out[name] = {"rows": rows, "inputs": inputs, "hidden": hidden, **summary, **ratios}
        data.delete()
    save(args.out, {
        "what": (
            f"2 processes on local[2], batch {BATCH}/process, SGD; medians of {args.reps} "
            f"interleaved reps of a 1-epoch and a {args.epochs}-epoch job per contender; "
            f"whole_epoch_s: rank 0, epoch 2's first step to epoch {args.epochs}'s over "
            f"{args.epochs - 2} epochs; whole_epoch_from_job_walls_s = (T({args.epochs}) - T(1)) "
            f"/ {args.epochs - 1}; step_loop_s, "
            f"boundary_s: epochs 2.. from inside rank 0; launch_s = call -> first line + "
            f"return -> caller"
        ),
        **out, **context(),
    })  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
