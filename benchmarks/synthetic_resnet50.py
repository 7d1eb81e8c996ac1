"""The field's standard benchmark, Horovod's synthetic one, under HorovodRunner and beside it.

Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py`` and
``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` time ResNet-50 on fixed random
images: warm-up batches, then iterations of N batches, each rank reporting images/sec. The
examples are not in horovod's sdist and are not vendored here, so this script is the same
protocol written out (fixed fake data, SGD lr 0.01 x size, ``DistributedOptimizer``,
broadcast of the initial state, ``--num-warmup-batches``, ``--num-batches-per-iter``,
``--num-iters``; img/sec per rank as their mean over iterations). The model is the full
ResNet-50 (25,557,032 parameters, torchvision's v1.5 layout, and
``keras.applications.ResNet50(weights=None)``); to fit 2 cores the images are 64 x 64 and
the batch 8 per rank (the examples: 224 x 224, batch 32 on a GPU). Batch norm is each rank's
own (the PyTorch example uses ``hvd.SyncBatchNorm``; torch's own SyncBatchNorm, which DDP
would use, runs only on GPUs).

The same step runs under these launchers, 1 and 2 ranks, interleaved rep by rep:

- ``horovodrunner``: ``HorovodRunner(np=N)`` on ``local[2]`` Spark barrier tasks, with the
  Horovod settings it gives its ranks by default (``HOROVOD_IDLE_WAIT_MS=20`` with the
  idle-wait patch, version 2: ``hvdrunner._horovod_knobs``);
- ``horovodrunner_stock`` (torch only): the same, the loop setting ``HOROVOD_IDLE_WAIT_MS=0``
  first (horovod's stock negotiation rounds: HorovodRunner before that default);
- ``horovodrun``: the same file run by ``horovodrun --gloo -np N`` (the launcher Horovod's
  docs use: it must cost no throughput next to HorovodRunner);
- ``horovodrunner_buckets`` (torch only): HorovodRunner, the loop with the two-line change
  that gives it ``hvdrunner.torch.fit``'s exchange (DDP-like buckets + the idle-wait patch);
- ``ddp`` (torch only): the same loop with ``DistributedDataParallel`` under ``torchrun``;
- ``horovodrunner_engine`` (TensorFlow only): HorovodRunner, the loop's one import changed to
  ``hvdrunner.hvd_tensorflow`` (Horovod's TensorFlow API on hvdrunner's engine);
- ``mirrored_strategy_runner`` (TensorFlow only): the same model, data and SGD on
  ``MultiWorkerMirroredStrategy`` (what Databricks recommends for TensorFlow) under
  spark-tensorflow-distributor's ``MirroredStrategyRunner(num_slots=N, use_gpu=False)``: a
  ``tf.function`` around ``strategy.run``, TensorFlow's own thread counts (the runner starts
  TensorFlow before the function runs).

On the modern stack the TF loop runs in tf_keras mode (``TF_USE_LEGACY_KERAS=1``):
``horovod.tensorflow.DistributedGradientTape`` fails on Keras 3 variables (``'Variable' object
has no attribute 'ref'``), which the results record from one run under Keras 3.

Results: ``benchmarks/results/synthetic_resnet50-<stack>.json`` (torch on the torch stack, TF
on modern).

    .venv-19/bin/python benchmarks/synthetic_resnet50.py [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _bench import context, save, stack

RESULTS = Path(__file__).parent / "results"
IMAGE, BATCH, WARMUP, PER_ITER, ITERS = 64, 8, 2, 4, 3


def torch_resnet50():
    """ResNet-50 as torchvision builds it (v1.5: the stride on the 3x3 convolution)."""
    import torch.nn as nn

    def bottleneck(cin: int, width: int, stride: int) -> nn.Module:
        out = width * 4
        body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out),
        )  # fmt: skip
        short = (nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                 if stride != 1 or cin != out else nn.Identity())  # fmt: skip

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body, self.short, self.relu = body, short, nn.ReLU(inplace=True)

            def forward(self, x):
                return self.relu(self.body(x) + self.short(x))

        return Block()

    layers, cin = [], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2048, 1000),
    )  # fmt: skip


def _timed(step, size: int) -> dict:
    for _ in range(WARMUP):
        step()
    per_iter = []
    for _ in range(ITERS):
        t = time.perf_counter()
        for _ in range(PER_ITER):
            step()
        per_iter.append(BATCH * PER_ITER / (time.perf_counter() - t))
    return {"img_sec_per_rank": statistics.mean(per_iter), "size": size}


def torch_step(ddp: bool = False, buckets: bool = False, stock: bool = False) -> dict:
    """One rank of the benchmark (horovod.torch, or torch.distributed DDP when ``ddp``).
    ``buckets``: the two-line change that gives the loop ``hvdrunner.torch.fit``'s exchange
    (``HOROVOD_IDLE_WAIT_MS=20`` before ``hvd.init()``, ``groups=buckets(model)``);
    ``stock``: ``HOROVOD_IDLE_WAIT_MS=0`` before ``hvd.init()`` (horovod's own rounds)."""
    import torch
    import torch.nn.functional as F

    from hvdrunner.torch.collectives import buckets as bucketed

    torch.manual_seed(0)
    model = torch_resnet50()
    if ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        size = dist.get_world_size()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    else:
        if buckets or stock:
            os.environ["HOROVOD_IDLE_WAIT_MS"] = "0" if stock else "20"
        import importlib

        # bare_recipe_knobs.py's engine variant: the recipe's import is hvdrunner.hvd_torch
        hvd = importlib.import_module(os.environ.get("HVDRUNNER_BENCH_HVD", "horovod.torch"))

        hvd.init()
        size = hvd.size()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * size),
                                       named_parameters=model.named_parameters(),
                                       groups=bucketed(model) if buckets else None)  # fmt: skip
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    data = torch.randn(BATCH, 3, IMAGE, IMAGE)
    target = torch.randint(0, 1000, (BATCH,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    out = _timed(step, size)
    out["params"] = sum(p.numel() for p in model.parameters())
    return out


def tf_step(module: str = "horovod.tensorflow") -> dict:
    """One rank of the benchmark in TensorFlow 2 (a tf.function step, ``DistributedGradientTape``)
    on ``module``: the compiled ``horovod.tensorflow`` or hvdrunner's engine
    (``hvdrunner.hvd_tensorflow``)."""
    import importlib

    import tensorflow as tf

    hvd = importlib.import_module(module)

    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(IMAGE, IMAGE, 3))
    opt = tf.keras.optimizers.SGD(0.01 * hvd.size())
    data = tf.random.uniform([BATCH, IMAGE, IMAGE, 3])
    target = tf.random.uniform([BATCH, 1], minval=0, maxval=999, dtype=tf.int64)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    first = [True]

    @tf.function
    def train(first_batch: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    def step() -> None:
        train(first[0])
        first[0] = False

    out = _timed(step, hvd.size())
    out["params"] = int(model.count_params())
    return out


def mwms_step() -> dict:
    """One worker of the same loop on ``MultiWorkerMirroredStrategy`` (what Databricks
    recommends for TensorFlow), under spark-tensorflow-distributor's ``MirroredStrategyRunner``,
    which runs this inside the strategy's scope: the per-replica step through
    ``strategy.run``, its gradients all-reduced by the strategy."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    size = strategy.num_replicas_in_sync
    # TensorFlow's own thread counts: the runner has started TensorFlow before this runs
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(IMAGE, IMAGE, 3))
    opt = tf.keras.optimizers.SGD(0.01 * size)
    data = tf.random.uniform([BATCH, IMAGE, IMAGE, 3])
    target = tf.random.uniform([BATCH, 1], minval=0, maxval=999, dtype=tf.int64)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        reduction=tf.keras.losses.Reduction.NONE
    )

    def replica_step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(target, model(data, training=True)),
                                              global_batch_size=BATCH * size)  # fmt: skip
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    @tf.function
    def train() -> None:
        strategy.run(replica_step)

    out = _timed(train, size)
    out["params"] = int(model.count_params())
    return out


def _one_rank_main() -> None:
    """Entry point under horovodrun / torchrun: print rank 0's figures as one JSON line."""
    ddp = "--ddp" in sys.argv
    out = torch_step(ddp) if stack() == "torch" else tf_step()
    rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _external(cmd: list[str], keras3: bool = False) -> dict:
    env = dict(os.environ, HVDRUNNER_SYNTHETIC_RANK="1")
    if keras3:
        env.pop("TF_USE_LEGACY_KERAS", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n"
                       f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()

    bindir = Path(sys.executable).parent
    horovodrun = [str(bindir / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2"]
    keras3 = None
    if stack() == "modern":  # Keras 3 by default: what the unchanged TF2 loop does there
        try:
            _external([*horovodrun, sys.executable, __file__], keras3=True)
            keras3 = {"ok": True, "error": None}
        except RuntimeError as e:
            lines = str(e).splitlines()  # the rank's own exception, not horovodrun's summary
            errors = [ln for ln in lines if "Error: " in ln and "<stderr>" in ln] or lines[-1:]
            keras3 = {"ok": False, "error": errors[-1].split("<stderr>:")[-1].strip()[:160]}
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before Spark's workers start: they inherit it

    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    local_session("local[2]", app_name="bench-synthetic").sparkContext.setLogLevel("ERROR")
    fn = torch_step if stack() == "torch" else tf_step
    launchers = {
        "horovodrunner": lambda n: HorovodRunner(np=n).run(fn),
        "horovodrun": lambda n: _external([str(bindir / "horovodrun"), "--gloo", "-np", str(n),
                                           "-H", f"localhost:{n}", sys.executable, __file__]),
    }  # fmt: skip
    if stack() == "modern":  # the same loop on hvdrunner's engine (nothing compiled)
        launchers["horovodrunner_engine"] = lambda n: HorovodRunner(np=n).run(
            fn, module="hvdrunner.hvd_tensorflow")  # fmt: skip
        from spark_tensorflow_distributor import MirroredStrategyRunner

        launchers["mirrored_strategy_runner"] = lambda n: MirroredStrategyRunner(
            num_slots=n, use_gpu=False).run(mwms_step)  # fmt: skip
    if stack() == "torch":
        launchers["horovodrunner_stock"] = lambda n: HorovodRunner(np=n).run(fn, stock=True)
        launchers["horovodrunner_buckets"] = lambda n: HorovodRunner(np=n).run(fn, buckets=True)
        launchers["ddp"] = lambda n: _external([str(bindir / "torchrun"), "--nproc-per-node",
                                                str(n), __file__, "--ddp"])  # fmt: skip
    runs: dict[str, dict[int, list[float]]] = {name: {1: [], 2: []} for name in launchers}
    params = 0
    for _ in range(args.reps):
        for n in (1, 2):
            for name, launch in launchers.items():
                out = launch(n)
                runs[name][n].append(out["img_sec_per_rank"])
                params = out["params"]
    table = {
        name: {f"np{n}_img_sec_per_rank": round(statistics.median(v), 2) for n, v in by_n.items()}
        for name, by_n in runs.items()
    }
    for row in table.values():
        row["np2_total_img_sec"] = round(2 * row["np2_img_sec_per_rank"], 2)
        row["scaling_efficiency"] = round(
            row["np2_img_sec_per_rank"] / row["np1_img_sec_per_rank"], 3
        )
    framework = "torch" if stack() == "torch" else "tensorflow"
    out = {
        "what": (
            f"Horovod's synthetic-benchmark protocol, {framework}: ResNet-50 ({params} params), "
            f"fake {IMAGE}x{IMAGE} images, batch {BATCH}/rank, SGD, {WARMUP} warm-up batches, "
            f"{ITERS} iterations of {PER_ITER} batches; img/sec per rank, median of {args.reps} "
            "interleaved reps; 1 and 2 ranks on one 2-core machine (the cores shared out)"
        ),
        **table,
        "horovodrunner_vs_horovodrun_np2": round(
            table["horovodrunner"]["np2_img_sec_per_rank"]
            / table["horovodrun"]["np2_img_sec_per_rank"], 3),
        **context(),
    }  # fmt: skip
    if "horovodrunner_engine" in table:
        out["engine_vs_compiled_np2"] = round(
            table["horovodrunner_engine"]["np2_img_sec_per_rank"]
            / table["horovodrunner"]["np2_img_sec_per_rank"], 3)  # fmt: skip
    if keras3 is not None:
        out["keras"] = "tf_keras (TF_USE_LEGACY_KERAS=1)"
        out["unchanged_loop_under_keras3"] = keras3
    if "ddp" in table:
        out["buckets_vs_ddp_np2"] = round(
            table["horovodrunner_buckets"]["np2_img_sec_per_rank"]
            / table["ddp"]["np2_img_sec_per_rank"], 3)  # fmt: skip
        out["horovod_vs_ddp_np2"] = round(
            table["horovodrunner"]["np2_img_sec_per_rank"] / table["ddp"]["np2_img_sec_per_rank"], 3
        )
        out["horovod_stock_vs_ddp_np2"] = round(
            table["horovodrunner_stock"]["np2_img_sec_per_rank"]
            / table["ddp"]["np2_img_sec_per_rank"], 3)  # fmt: skip
    path = RESULTS / f"synthetic_resnet50-{stack()}.json"
    save(path, out)


if __name__ == "__main__":
    if os.environ.get("HVDRUNNER_SYNTHETIC_RANK"):
        _one_rank_main()
    else:
        main()
