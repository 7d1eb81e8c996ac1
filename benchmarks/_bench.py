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


def flowers_table(spark, folder: Path, size: int):  # -> (pyspark.sql.DataFrame, int)
    """The image benchmarks' table: 500 synthetic flower JPEGs (``size`` pixels square)
    written under ``folder``, read with Spark's ``binaryFile`` source as ``content`` (bytes)
    and ``label_index`` (the folder's name, indexed), in 4 partitions, cached; and the JPEG
    files' bytes on disk."""
    from pyspark.ml.feature import StringIndexer
    from pyspark.sql import functions as F

    from hvdrunner.examples.datasets import write_synthetic_flowers

    root = write_synthetic_flowers(str(folder), per_class=100, size=size)
    jpeg_bytes = sum(p.stat().st_size for p in Path(root).rglob("*.jpg"))
    df = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(root)
          .withColumn("label", F.element_at(F.split("path", "/"), -2)))  # fmt: skip
    df = StringIndexer(inputCol="label", outputCol="label_index").fit(df).transform(df)
    df = df.select("content", "label_index").repartition(4).cache()
    df.count()
    return df, jpeg_bytes
