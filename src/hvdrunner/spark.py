"""A local SparkSession set up the way hvdrunner's local runs and tests need it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

_LOG4J = Path(__file__).with_name("log4j2-local.properties")


def local_session(master: str = "local[2]", app_name: str = "hvdrunner", **conf: str) -> Any:
    """Get or create a SparkSession whose Python workers use this interpreter.

    Sets ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` to ``sys.executable`` (executors of
    ``local-cluster`` otherwise start the system Python, without horovod). Spark's own log
    lines follow ``log4j2-local.properties`` (Spark's defaults at WARN, without the two
    warnings every local session prints) unless ``conf`` sets the JVMs' Java options.

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
    log4j = f"-Dlog4j2.configurationFile=file:{_LOG4J}"
    for side in ("driver", "executor"):
        builder = builder.config(f"spark.{side}.extraJavaOptions", log4j)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
