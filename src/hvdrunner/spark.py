"""A local SparkSession set up the way hvdrunner's local runs and tests need it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_LOG4J = Path(__file__).with_name("log4j2-local.properties")
#: What the JDK prints when it starts because Spark 4's launcher always adds
#: ``--add-modules=jdk.incubator.vector``: not news, and no JVM option silences it.
JVM_BANNER = b"WARNING: Using incubator modules"
#: The JVM's stderr goes through this filter process (not a thread here: the JVM must never
#: wait on this interpreter's GIL, or on a test framework's swapped ``sys.stderr``).
_FILTER = (
    "import sys\n"
    "for line in sys.stdin.buffer:\n"
    f"    if {JVM_BANNER!r} not in line:\n"
    "        sys.stdout.buffer.write(line)\n"
    "        sys.stdout.buffer.flush()\n"
)


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

    log4j = f"-Dlog4j2.configurationFile=file:{_LOG4J}"
    options = {
        "spark.master": master, "spark.app.name": app_name, "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "4",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.driver.extraJavaOptions": log4j, "spark.executor.extraJavaOptions": log4j,
        **conf,
    }  # fmt: skip
    _start_jvm(options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _start_jvm(options: dict[str, str]) -> None:
    """Start Spark's driver JVM as pyspark would, with ``options``, its stderr through a
    filter that drops :data:`JVM_BANNER`; nothing when a JVM is already there (a running
    session, or a gateway handed in by the environment)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return
        # The filter writes to this process's stderr (fd 2), where the JVM would have.
        relay = subprocess.Popen([sys.executable, "-c", _FILTER], stdin=subprocess.PIPE, stdout=2)
        assert relay.stdin is not None
        try:
            gateway = launch_gateway(
                SparkConf().setAll(list(options.items())), popen_kwargs={"stderr": relay.stdin}
            )
        finally:
            relay.stdin.close()  # the JVM holds it now: the filter ends when the JVM does
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm
