"""What every benchmark records next to its figures: the stack, the machine, the date."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from hvdrunner._versions import major_minor, tensorflow, version


def stack() -> str:
    """The Makefile's STACK (``15.4``, ``18``, ``19``: runtime replicas; ``gpu``). A venv
    without it gets the name of the stack its frameworks match among those the replicas
    replaced, whose results files keep their names: ``lts`` (TF <= 2.15), ``modern`` (TF >=
    2.16) or ``torch`` (no TF)."""
    if os.environ.get("STACK") in ("15.4", "18", "19", "gpu"):
        return os.environ["STACK"]
    if tensorflow() is None:
        return "torch"
    return "lts" if major_minor(tensorflow() or "0") < (2, 16) else "modern"


def context() -> dict:
    frameworks = ", ".join(
        f"{name} {version(dist)}" for name, dist in (("TF", "tensorflow"), ("torch", "torch"))
        if version(dist)
    )  # fmt: skip
    return {
        "stack": stack(),
        "versions": f"Python {platform.python_version()}, {frameworks}, pyarrow {version('pyarrow')}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') >> 30} GiB",
        "date": time.strftime("%Y-%m-%d"),
    }


def save(path: Path, out: dict) -> None:
    """Write a benchmark's results to ``path`` (benchmarks/results/...) and print them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def warm_local_session(app_name: str):  # -> pyspark.sql.SparkSession
    """A ``local[2]`` session whose executors' Python workers are already started, so the
    first launch timed is not the one that starts them."""
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name=app_name)
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.parallelize(range(2), 2).count()
    return spark
