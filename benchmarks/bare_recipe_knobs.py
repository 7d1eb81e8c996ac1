"""Which runner-side Horovod setting brings the unchanged ``horovod.torch`` recipe level with
DDP (issue 43, point 4)? Each variant is an environment the rank gets before ``hvd.init()``,
the recipe itself unchanged (per-tensor ``hvd.DistributedOptimizer``); DDP under
``torchrun`` is the yardstick; all interleaved rep by rep, 2 ranks on ``local[2]``.

- ``--model resnet50``: Horovod's synthetic protocol as ``synthetic_resnet50.py`` runs it
  (img/sec per rank);
- ``--model mlp``: MLP 784-256-10, batch 64 per rank, in-memory random batches, 600 timed
  steps after 50 (ms per step; the step alone, no data loading).

The variant ``engine`` runs the same recipe with its import changed to
``import hvdrunner.hvd_torch as hvd`` (hvdrunner's engine on torch.distributed, issue 48).

Variants are JSON: ``{"name": {"env": {...}, "buckets": false}}`` (``buckets``: the
recipe's documented two-line change, ``groups=hvdrunner.torch.buckets(model)``). Results:
``benchmarks/results/bare_recipe_knobs-torch.json``, one entry per ``--label``.

    .venv-19/bin/python benchmarks/bare_recipe_knobs.py --model resnet50 --reps 5
    .venv-19/bin/python benchmarks/bare_recipe_knobs.py --model mlp --label try \\
        --variants '{"cycle20": {"env": {"HOROVOD_CYCLE_TIME": "20"}}, "default": {}}'
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

import synthetic_resnet50 as r50
from _bench import context

RESULTS = Path(__file__).parent / "results" / "bare_recipe_knobs-torch.json"
MLP_STEPS, MLP_WARMUP, MLP_BATCH = 600, 50, 64
#: The recipe's one import: ``import <this> as hvd`` (``hvdrunner.hvd_torch``: the engine).
ENGINE_ENV = "HVDRUNNER_BENCH_HVD"
DEFAULT_VARIANTS = {"stock": {"env": {"HOROVOD_IDLE_WAIT_MS": "0"}}, "default": {},
                    "engine": {"env": {ENGINE_ENV: "hvdrunner.hvd_torch"}}}  # fmt: skip


def mlp_step(env: dict[str, str], ddp: bool = False, buckets: bool = False) -> dict:
    """One rank: the recipe (or DDP) on the MLP; mean ms per step."""
    import torch
    import torch.nn.functional as F

    os.environ.update(env)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    if ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        import importlib

        from hvdrunner.torch.collectives import buckets as bucketed

        hvd = importlib.import_module(os.environ.get(ENGINE_ENV, "horovod.torch"))

        hvd.init()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(),
                                       groups=bucketed(model) if buckets else None)  # fmt: skip
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    xs, ys = torch.randn(16, MLP_BATCH, 784), torch.randint(0, 10, (16, MLP_BATCH))
    for i in range(MLP_WARMUP + MLP_STEPS):
        if i == MLP_WARMUP:
            started = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(xs[i % 16]), ys[i % 16]).backward()
        opt.step()
    return {"value": (time.perf_counter() - started) / MLP_STEPS * 1000}


def resnet_step(env: dict[str, str], buckets: bool = False) -> dict:
    """One rank: the synthetic ResNet-50 loop; img/sec per rank."""
    os.environ.update(env)
    return {"value": r50.torch_step(buckets=buckets)["img_sec_per_rank"]}


def _ddp(model: str) -> float:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    if model == "resnet50":
        return r50._external([torchrun, "--nproc-per-node", "2", r50.__file__, "--ddp"])[
            "img_sec_per_rank"
        ]
    env = dict(os.environ, HVDRUNNER_KNOBS_DDP="1")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", __file__], env=env,
                          text=True, capture_output=True, timeout=600, check=False)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"DDP run failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return float(json.loads(lines[0][len("RESULT ") :])["value"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=("mlp", "resnet50"), required=True)
    parser.add_argument("--variants", default=json.dumps(DEFAULT_VARIANTS),
                        help="JSON, see the docstring (default: stock rounds, HorovodRunner's default)")  # fmt: skip
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--label", help="this run's key in the results file "
                        "(default: <model>-default-<reps>reps)")  # fmt: skip
    args = parser.parse_args()
    variants = json.loads(args.variants)
    label = args.label or f"{args.model}-default-{args.reps}reps"

    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    local_session("local[2]", app_name="bench-knobs").sparkContext.setLogLevel("ERROR")
    step = mlp_step if args.model == "mlp" else resnet_step
    runs: dict[str, list[float]] = {name: [] for name in [*variants, "ddp"]}
    for _ in range(args.reps):
        for name, spec in variants.items():
            out = HorovodRunner(np=2).run(step, env=spec.get("env", {}),
                                          buckets=spec.get("buckets", False))  # fmt: skip
            runs[name].append(out["value"])
            print(name, round(out["value"], 3), flush=True)
        runs["ddp"].append(_ddp(args.model))
        print("ddp", round(runs["ddp"][-1], 3), flush=True)
    ddp = statistics.median(runs["ddp"])
    unit = "ms_per_step" if args.model == "mlp" else "img_sec_per_rank"
    table = {}
    for name, values in runs.items():
        median = statistics.median(values)
        speed = ddp / median if args.model == "mlp" else median / ddp
        table[name] = {unit: round(median, 3), "reps": [round(v, 3) for v in values],
                       "speed_vs_ddp": round(speed, 3), **variants.get(name, {})}  # fmt: skip
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[label] = {"model": args.model, "reps": args.reps, "median_of_reps": table,
                           **context()}  # fmt: skip
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    if os.environ.get("HVDRUNNER_KNOBS_DDP"):
        out = mlp_step({}, ddp=True)
        if os.environ.get("RANK") == "0":
            print("RESULT " + json.dumps(out), flush=True)
    else:
        main()
