"""A local SparkSession set up the way hvdrunner's local runs and tests need it."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(master: str = "local[2]", app_name: str = "hvdrunner", **conf: str) -> Any:
    """Get or create a SparkSession whose Python workers use this interpreter.

    Sets ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` to ``sys.executable`` (executors of
    ``local-cluster`` otherwise start the system Python, without horovod).

    Args:
        master: ``local[N]`` or ``local-cluster[W,C,M]``; on Databricks use the existing
            ``spark`` instead.
        app_name: the Spark application name.
        **conf: extra Spark settings, e.g. ``{"spark.task.cpus": "1"}`` (dots are allowed
            through ``**{...}``).

    Example:
        >>> spark = local_session("local[2]")  # doctest: +SKIP
        >>> spark.sparkContext.defaultParallelism  # doctest: +SKIP
        2
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
