"""Launch overhead: HorovodRunner(np=2) vs horovod.spark.run(num_proc=2), same warm Spark.

Both run a no-op function on local[2] (the same SparkSession, already warm). Reports
medians over several repetitions to benchmarks/results/launch_overhead.json.

    .venv/bin/python benchmarks/launch_overhead.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import warm_local_session  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "launch_overhead.json"


def noop() -> int:
    return 0


def time_call(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    import horovod.spark

    from hvdrunner import HorovodRunner

    spark = warm_local_session("bench-launch")

    runner = HorovodRunner(np=2)
    ours = time_call(lambda: runner.run(noop), args.reps)
    theirs = time_call(
        lambda: horovod.spark.run(noop, num_proc=2, use_gloo=True, verbose=0), args.reps
    )
    result = {
        "what": "wall seconds of one no-op job with 2 ranks on local[2], warm SparkSession",
        "hvdrunner_runs_s": [round(x, 3) for x in ours],
        "horovod_spark_run_s": [round(x, 3) for x in theirs],
        "hvdrunner_median_s": round(statistics.median(ours), 3),
        "horovod_spark_run_median_s": round(statistics.median(theirs), 3),
        "ratio": round(statistics.median(ours) / statistics.median(theirs), 3),
        "reps": args.reps,
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
