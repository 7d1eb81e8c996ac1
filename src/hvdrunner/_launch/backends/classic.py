"""The classic backend: one supervisor per rank on the barrier tasks of an RDD stage, on a
SparkContext in this process (``np >= 0``; a Spark Connect session has its own backend)."""

from __future__ import annotations

import socket
import time
from typing import Any

from hvdrunner._launch.backends.barrier import (
    BarrierStageLaunch,
    barrier_task,
    refuse_dynamic_allocation,
    refuse_np_above,
)
from hvdrunner._launch.rank.task import TaskSpec

#: How long preflight waits for executors to register before declaring too few slots.
EXECUTOR_WAIT_S = 30.0


def _conf(sc: Any, key: str, default: str) -> str:
    return str(sc.getConf().get(key, default))


def task_slots(sc: Any) -> tuple[int, str]:
    """How many tasks the cluster can run at once with the default resource profile.

    Returns the count and what limits it (for the error message).
    """
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    slots = int(jsc.maxNumConcurrentTasks(profile))
    gpu_amount = _conf(sc, "spark.task.resource.gpu.amount", "")
    if gpu_amount:
        why = f"GPUs / spark.task.resource.gpu.amount={gpu_amount}"
    else:
        why = f"executor cores / spark.task.cpus={_conf(sc, 'spark.task.cpus', '1')}"
    return slots, why


def running_tasks(sc: Any) -> int:
    """Tasks holding executor cores now, as the task scheduler counts them: a cancelled
    job's tasks until their Python workers are gone included. (The status tracker's
    per-stage counts lag by up to a heartbeat, 10 s, both ways; they are the fallback where
    the scheduler's count cannot be read.)"""
    try:
        counts = sc._jsc.sc().taskScheduler().runningTasksByExecutors().valuesIterator()
        busy = 0
        while counts.hasNext():
            busy += int(counts.next())
        return busy
    except Exception:  # noqa: BLE001 - a Spark without this method: the tracker's count
        tracker = sc.statusTracker()
        stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
        return sum(info.numActiveTasks for info in stages if info is not None)


def free_slots(sc: Any) -> tuple[int, str]:
    """:func:`task_slots` less the tasks running now in any stage of this SparkContext
    (other jobs of the notebook, a failed attempt's tasks still ending)."""
    slots, why = task_slots(sc)
    busy = running_tasks(sc)
    free = max(0, slots - busy)
    return free, f"{why}; {busy} of {slots} slots busy with running tasks" if busy else why


def _wait_for_slots(sc: Any, want: int, wait_s: float) -> tuple[int, str]:
    """:func:`task_slots`, polled each second until there are ``want`` or ``wait_s`` passed."""
    deadline = time.monotonic() + wait_s
    slots, why = task_slots(sc)
    while slots < want and time.monotonic() < deadline:
        time.sleep(1.0)
        slots, why = task_slots(sc)
    return slots, why


def preflight(sc: Any, np: int, wait_s: float = EXECUTOR_WAIT_S) -> None:
    """Fail before launching when barrier mode cannot run ``np`` tasks at once.

    Raises:
        RuntimeError: dynamic allocation is on (barrier stages refuse it).
        ValueError: fewer task slots than ``np`` (after waiting up to ``wait_s``, at most
            30 s, for executors of a non-local cluster to register).
    """
    refuse_dynamic_allocation(_conf(sc, "spark.dynamicAllocation.enabled", "false"))
    # Executors of a freshly started cluster register over a few seconds.
    wait = 0.0 if sc.master.startswith("local[") else min(wait_s, EXECUTOR_WAIT_S)
    slots, why = _wait_for_slots(sc, np, wait)
    refuse_np_above(np, slots, f"{why}, master={sc.master}")


#: With ``min_np``, how long a restart waits for ``np`` free slots before it takes fewer:
#: the failed attempt's own tasks take a moment to end after their job was cancelled.
SETTLE_S = 3.0
#: Polls (0.5 s apart) a free-slot count must hold before a restart takes it.
STABLE_POLLS = 3


def slots_for_restart(sc: Any, np: int, min_np: int | None, wait_s: float) -> int:
    """How many ranks a restart runs with, once the cluster has them free (after a lost host).

    ``np`` as soon as ``np`` task slots are free (a replaced node registered, another job
    finished); with ``min_np``, every free slot between ``min_np`` and ``np`` once
    :data:`SETTLE_S` passed. Free means not running a task of any job of this SparkContext:
    slots another job holds are not this job's. Waits at most ``wait_s`` (``start_timeout``).

    Raises:
        ValueError: fewer free slots than ``min_np`` (or ``np``) after ``wait_s``, naming both.
    """
    least = np if min_np is None else min_np
    start = time.monotonic()
    seen: list[int] = []  # the free count at each poll
    while True:
        free, why = free_slots(sc)
        seen.append(free)
        waited = time.monotonic() - start
        # A count is trusted once it held over STABLE_POLLS polls: when the failed attempt's
        # tasks end, Spark hands their slots to jobs already waiting within a moment.
        stable = len(seen) >= STABLE_POLLS and len(set(seen[-STABLE_POLLS:])) == 1
        if stable and (free >= np or (free >= least and waited >= min(SETTLE_S, wait_s))):
            return min(np, free)
        if waited >= wait_s:
            break
        time.sleep(0.5)
    raise ValueError(
        f"After the failure the cluster has {free} free task slots ({why}), fewer than "
        f"{'min_np=' if min_np is not None else 'np='}{least}, for start_timeout="
        f"{wait_s:g}s. Add workers (a lost node is usually replaced within minutes), "
        f"raise start_timeout, or allow fewer ranks with HorovodRunner(min_np=...)."
    )


def driver_address(sc: Any) -> str:
    """The driver's address as executors see it (``spark.driver.host``), resolved to an IP."""
    host = _conf(sc, "spark.driver.host", socket.gethostname())
    return socket.gethostbyname(host)


class SparkLaunch(BarrierStageLaunch):
    """The barrier stage of an RDD, under its own job group."""

    def __init__(self, sc: Any, np: int, spec: TaskSpec) -> None:
        super().__init__(np, spec, "hvdrunner-spark-job")
        self._sc = sc

    def _stage(self) -> None:
        self._sc.setJobGroup(self._group, f"hvdrunner: {self._np} Horovod ranks", True)
        rdd = self._sc.parallelize(range(self._np), self._np)
        rdd.barrier().mapPartitions(barrier_task(self._spec)).collect()

    def _cancel(self) -> None:
        self._sc.cancelJobGroup(self._group)


class ClassicBackend:
    """:class:`~hvdrunner._launch.backends.base.Backend` on this process's SparkContext."""

    bind = "0.0.0.0"

    def __init__(self, sc: Any) -> None:
        self._sc = sc
        self.where = f"Spark barrier tasks ({sc.master})"
        self.spread_host_gpus = str(sc.master).startswith("local")

    @classmethod
    def active(cls) -> ClassicBackend | None:
        """The backend of this process's active SparkContext, or None without one."""
        try:
            from pyspark import SparkContext
        except ImportError:  # pragma: no cover - pyspark is part of every stack
            return None
        sc = SparkContext._active_spark_context
        return None if sc is None else cls(sc)

    def slots(self) -> int:
        return task_slots(self._sc)[0]

    def describe_slots(self) -> str:
        slots, why = task_slots(self._sc)
        return f"{slots} task slots ({why})"

    def preflight(self, np: int, min_np: int | None, wait_s: float) -> None:
        preflight(self._sc, np, wait_s=wait_s)

    def slots_for_restart(self, np: int, min_np: int | None, wait_s: float) -> int:
        return slots_for_restart(self._sc, np, min_np, wait_s)

    def driver_address(self) -> str:
        return driver_address(self._sc)

    def launch(self, np: int, spec: TaskSpec) -> SparkLaunch:
        return SparkLaunch(self._sc, np, spec)
