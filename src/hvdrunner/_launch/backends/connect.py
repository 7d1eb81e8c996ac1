"""The Spark Connect backend: the ranks as the barrier tasks of a DataFrame stage
(``mapInArrow(..., barrier=True)``), started from a Spark Connect session - Databricks
Connect, serverless and shared-access notebooks, ``SparkSession.builder.remote(...)`` -
where there is no SparkContext and no RDD.

What a Connect client cannot see is the scheduler: it reads the cluster's size from the
session's conf where the conf says it (``local[N]``, ``local-cluster[...]``,
``spark.executor.instances`` x cores), and leaves the rest to the barrier stage, bounded by
``start_timeout``. ``min_np`` needs the scheduler's free-slot count and is refused here.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
from collections.abc import Iterator
from typing import Any

from hvdrunner._launch.backends.barrier import (
    BarrierStageLaunch,
    refuse_dynamic_allocation,
    refuse_np_above,
    run_barrier_slot,
)
from hvdrunner._launch.rank.task import TaskSpec, local_ip_towards

#: Overrides the address the ranks reach this process at (a client behind NAT, a host with
#: several interfaces): the ranks connect back to the process that called ``run()``.
DRIVER_ADDRESS_ENV = "HVDRUNNER_DRIVER_ADDRESS"

_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")


def active_session() -> Any | None:
    """The Spark Connect session of this thread (or the process' default), or None.

    A Connect session exists only once ``pyspark.sql.connect.session`` was imported, so a
    process without one never imports the Connect client (or needs grpc) here.
    """
    module = sys.modules.get("pyspark.sql.connect.session")
    if module is None:
        return None
    cls = module.SparkSession
    return cls.getActiveSession() or cls._get_default_session()


def _conf(spark: Any, key: str) -> str:
    value = spark.conf.get(key, None)
    return "" if value is None else str(value)


def task_slots(spark: Any) -> tuple[int | None, str]:
    """The cluster's task slots as the session's conf tells them, or None (and why not)."""
    master = _conf(spark, "spark.master")
    cpus = int(_conf(spark, "spark.task.cpus") or "1")
    if m := _LOCAL.fullmatch(master):
        cores = m.group(1) or "1"
        if cores == "*":
            return None, f"master={master}: the server's core count is not in its conf"
        return int(cores) // cpus, f"master={master}, spark.task.cpus={cpus}"
    if m := _LOCAL_CLUSTER.fullmatch(master):
        slots = int(m.group(1)) * (int(m.group(2)) // cpus)
        return slots, f"master={master}, spark.task.cpus={cpus}"
    instances, cores = (
        _conf(spark, "spark.executor.instances"),
        _conf(spark, "spark.executor.cores"),
    )
    if instances and cores:
        slots = int(instances) * (int(cores) // cpus)
        why = f"spark.executor.instances={instances} x spark.executor.cores={cores}"
        return slots, f"{why} / spark.task.cpus={cpus}"
    return None, f"master={master or '?'} does not state its executors in the session's conf"


def driver_address(spark: Any) -> str:
    """This process's address as the cluster reaches it: the local end of the route to the
    Connect server, or the Spark driver's host when the server runs here (loopback)."""
    if os.environ.get(DRIVER_ADDRESS_ENV):
        return socket.gethostbyname(os.environ[DRIVER_ADDRESS_ENV])
    builder = spark.client._builder
    host, port = str(builder.host).strip("[]"), 15002
    endpoint = getattr(builder, "endpoint", "")
    if endpoint and endpoint.rsplit(":", 1)[-1].isdigit():
        port = int(endpoint.rsplit(":", 1)[-1])
    ip = local_ip_towards(socket.gethostbyname(host), port)
    if ipaddress.ip_address(ip).is_loopback:  # the server is on this machine
        ip = socket.gethostbyname(_conf(spark, "spark.driver.host") or socket.gethostname())
    return ip


def _arrow_task(spec: TaskSpec) -> Any:
    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:  # the stage's one input row per task
            pass
        yield pa.RecordBatch.from_pydict({"exit_code": [run_barrier_slot(spec)]})

    return task


class ConnectLaunch(BarrierStageLaunch):
    """The barrier stage of a DataFrame, under its own tag, interrupted by it."""

    def __init__(self, spark: Any, np: int, spec: TaskSpec) -> None:
        super().__init__(np, spec, "hvdrunner-connect-job")
        self._spark = spark

    def _stage(self) -> None:
        self._spark.addTag(self._group)  # tags are per thread: this stage's only
        try:
            frame = self._spark.range(0, self._np, 1, self._np)
            frame.mapInArrow(_arrow_task(self._spec), "exit_code int", barrier=True).collect()
        finally:
            self._spark.removeTag(self._group)

    def _cancel(self) -> None:
        try:
            self._spark.interruptTag(self._group)
        except Exception:  # noqa: BLE001 - a session already gone has nothing running
            pass


class ConnectBackend:
    """:class:`~hvdrunner._launch.backends.base.Backend` on a Spark Connect session."""

    bind = "0.0.0.0"

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._master = _conf(spark, "spark.master")
        self.where = f"Spark barrier tasks over Spark Connect ({self._master or 'remote'})"
        self.spread_host_gpus = self._master.startswith("local")

    @classmethod
    def active(cls) -> ConnectBackend | None:
        session = active_session()
        return None if session is None else cls(session)

    def slots(self) -> int:
        slots, why = task_slots(self._spark)
        if slots is None:
            raise ValueError(
                f"np=0 means every task slot of the cluster, which a Spark Connect session "
                f"cannot count here ({why}). Pass np=N, the number of ranks to run."
            )
        return slots

    def describe_slots(self) -> str:
        slots, why = task_slots(self._spark)
        return f"{'an unknown number of' if slots is None else slots} task slots ({why})"

    def preflight(self, np: int, min_np: int | None, wait_s: float) -> None:
        if min_np is not None:
            raise ValueError(
                f"min_np={min_np} needs the cluster's free task slots, which a Spark Connect "
                f"session cannot read (only a SparkContext's scheduler can). Drop min_np: "
                f"restarts then wait up to start_timeout for np={np} slots."
            )
        refuse_dynamic_allocation(_conf(self._spark, "spark.dynamicAllocation.enabled"))
        slots, why = task_slots(self._spark)
        if slots is not None:
            refuse_np_above(np, slots, why)

    def slots_for_restart(self, np: int, min_np: int | None, wait_s: float) -> int:
        # The barrier stage waits for np slots itself; start_timeout bounds the wait.
        return np

    def driver_address(self) -> str:
        return driver_address(self._spark)

    def launch(self, np: int, spec: TaskSpec) -> ConnectLaunch:
        return ConnectLaunch(self._spark, np, spec)
