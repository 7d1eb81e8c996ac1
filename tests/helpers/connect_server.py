"""A real Spark Connect server for tests: ``SparkConnectServer`` in its own JVM (pyspark's
``spark-submit``, the jar pyspark 4 ships), on a free port, master ``local[N]``. The test
process then holds only a Connect client session - no SparkContext of its own is used,
as on Databricks Connect or a serverless notebook."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers.ports import free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Connect server exited ({proc.returncode}):\n"
                               f"{log.read_text()[-3000:]}")  # fmt: skip
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"the Connect server did not listen within {within}s:\n"
                       f"{log.read_text()[-3000:]}")  # fmt: skip


@contextmanager
def connect_server(workdir: Path, master: str = "local[2]") -> Iterator[str]:
    """Start the server; yield its ``sc://`` URL; stop it (its whole process group)."""
    import pyspark

    from hvdrunner import spark as hvd_spark

    home = Path(pyspark.__file__).parent
    port = free_port()
    log4j = f"-Dlog4j2.configurationFile=file:{hvd_spark._LOG4J}"
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    cmd = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master,
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
           "--conf", f"spark.executorEnv.PYSPARK_PYTHON={sys.executable}",
           "--conf", f"spark.driver.extraJavaOptions={log4j}", "spark-internal"]  # fmt: skip
    log = workdir / "connect-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=workdir)  # fmt: skip
    try:
        _wait_for_port(port, proc, log, within=120)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def client_session(url: str) -> Any:
    """A Spark Connect client session to ``url`` (this thread's active session).

    Built with the Connect builder itself: pyspark's generic builder refuses a remote
    session in a process that already holds a SparkContext (the test session's classic
    one). The process is marked Connect-mode as that builder marks it, so pyspark's
    functions build Connect columns; the caller removes the mark when done.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    return ConnectSession.builder.remote(url).getOrCreate()


@contextmanager
def connect_session(workdir: Path) -> Iterator[Any]:
    """A Connect client session to a fresh local[2] server (:func:`connect_server`), active
    while the block runs; afterwards the server is stopped and the process's Connect-mode
    mark removed, so the classic tests that follow see pyspark as it was (its functions
    would otherwise build Connect columns)."""
    with connect_server(workdir) as url:
        session = client_session(url)
        try:
            yield session
        finally:
            session.stop()
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
