"""A PyTorch job's whole launch, and ``hvd.init()``'s share of it: the same function under
``HorovodRunner(np=2)`` and under pyspark's ``TorchDistributor(num_processes=2)`` (Spark
barrier tasks both, one warm ``local[2]`` session), contenders interleaved.

The function imports ``hvdrunner.hvd_torch``, calls ``hvd.init()``, one allreduce and
``hvd.shutdown()``; it runs unchanged under both launchers (the engine reads either one's
environment) and returns, from rank 0, how long its import and its ``init()`` took.
Reported per launcher: the median wall of the call (call -> rank 0's value back), and of the
import and ``init()`` inside it.

    .venv-19/bin/python benchmarks/engine_launch.py [--reps 5]

writes benchmarks/results/engine_launch-torch.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import context, save, warm_local_session  # noqa: E402


def job() -> tuple[float, float]:
    started = time.perf_counter()
    import torch

    import hvdrunner.hvd_torch as hvd

    imported = time.perf_counter()
    hvd.init()
    ready = time.perf_counter()
    hvd.allreduce(torch.ones(1), name="one")
    hvd.shutdown()
    return imported - started, ready - imported


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor

    from hvdrunner import HorovodRunner

    warm_local_session("bench-engine-launch")
    launchers = {
        "HorovodRunner(np=2)": lambda: HorovodRunner(np=2).run(job),
        "TorchDistributor(num_processes=2)": lambda: TorchDistributor(
            num_processes=2, local_mode=False, use_gpu=False).run(job),
    }  # fmt: skip
    for call in launchers.values():  # one warm-up each: imports in the Spark workers
        call()
    walls: dict[str, list[float]] = {name: [] for name in launchers}
    inside: dict[str, list[tuple[float, float]]] = {name: [] for name in launchers}
    for _ in range(args.reps):
        for name, call in launchers.items():
            started = time.perf_counter()
            inside[name].append(call())
            walls[name].append(time.perf_counter() - started)
    rows = {
        name: {
            "wall_s": round(statistics.median(walls[name]), 3),
            "wall_range_s": [round(min(walls[name]), 3), round(max(walls[name]), 3)],
            "import_s": round(statistics.median(i for i, _ in inside[name]), 3),
            "hvd_init_s": round(statistics.median(n for _, n in inside[name]), 3),
        }
        for name in launchers
    }
    hr, td = (rows[name]["wall_s"] for name in launchers)
    save(Path(__file__).parent / "results" / "engine_launch-torch.json", {
        "what": "a 2-rank PyTorch job that imports hvdrunner.hvd_torch, inits, allreduces once: "
                "wall of the call (medians of --reps, interleaved), rank 0's import and "
                "hvd.init() inside it",
        "command": f"benchmarks/engine_launch.py --reps {args.reps}",
        **context(), "launchers": rows, "ratio": round(hr / td, 3),
    })  # fmt: skip


if __name__ == "__main__":
    main()
