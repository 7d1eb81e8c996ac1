"""Runs in its own interpreter (one SparkContext per process): HorovodRunner on
local-cluster[2,1,1024] with fake GPU discovery, then preflight against dynamic allocation.
Prints one JSON line with what it observed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hvdrunner import HorovodRunner
from hvdrunner.spark import local_session

HERE = Path(__file__).resolve().parent


def report() -> dict:
    from pyspark import TaskContext  # noqa: F401  (pyspark importable in the rank)

    # the engine, every stack's default: what Spark's scheduler gives a rank is no framework's
    import hvdrunner.hvd_torch as hvd

    hvd.init()
    return hvd.allgather_object(
        {
            "rank": hvd.rank(),
            "local_rank": hvd.local_rank(),
            "cross_size": hvd.cross_size(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ppid": os.getppid(),
        }
    )


def main(counter: str) -> None:
    os.environ["HVDRUNNER_FAKE_GPU_COUNTER"] = counter
    script = str(HERE / "fake_gpu_discovery.sh")
    spark = local_session(
        "local-cluster[2,1,1024]",
        **{
            "spark.worker.resource.gpu.amount": "1",
            "spark.worker.resource.gpu.discoveryScript": script,
            "spark.executor.resource.gpu.amount": "1",
            "spark.task.resource.gpu.amount": "1",
            "spark.executorEnv.PYTHONPATH": os.pathsep.join(sys.path),
        },
    )
    sc = spark.sparkContext
    ranks = HorovodRunner(np=2, start_timeout=120).run(report)
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
    out: dict = {"ranks": ranks, "executors": executors}
    try:
        HorovodRunner(np=3, start_timeout=3).run(report)
    except ValueError as exc:
        out["too_many"] = str(exc)
    spark.stop()
    spark = local_session("local[2]", **{"spark.dynamicAllocation.enabled": "true"})
    try:
        HorovodRunner(np=2).run(report)
    except RuntimeError as exc:
        out["dynamic_allocation"] = str(exc)
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
