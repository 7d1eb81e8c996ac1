"""What the two Spark session backends share: the ranks as the tasks of one barrier stage
(an RDD's on a SparkContext, a DataFrame's over Spark Connect) - the task body, a launch run
in the background and cancelled by its group, and the preflight refusals barrier stages
need."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

from hvdrunner._launch.rank.task import TaskSpec, run_slot


def refuse_dynamic_allocation(enabled: str) -> None:
    """Raise ``RuntimeError`` when ``spark.dynamicAllocation.enabled`` is ``enabled``: barrier
    stages refuse it (both session backends' preflight)."""
    if enabled.lower() == "true":
        raise RuntimeError(
            "Spark dynamic allocation (spark.dynamicAllocation.enabled=true) cannot serve "
            "barrier-mode stages, which Horovod needs. Disable it on the cluster (on "
            "Databricks: a fixed-size cluster without autoscaling), or use np<0 to run on "
            "the driver only."
        )


def refuse_np_above(np: int, slots: int, why: str) -> None:
    """Raise ``ValueError`` when ``np`` ranks need more task slots than ``slots`` (``why``:
    what limits them), naming the fixes (both session backends' preflight)."""
    if slots < np:
        raise ValueError(
            f"np={np} needs {np} Spark tasks at once, but the cluster offers {slots} task "
            f"slots ({why}). Pass np<={slots}, add workers, or lower "
            f"spark.task.cpus / spark.task.resource.gpu.amount."
        )


def run_barrier_slot(spec: TaskSpec) -> int:
    """Inside a barrier task (an RDD's or a DataFrame's): this task's slot, from its context."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    partition = ctx.partitionId()
    address = ctx.getTaskInfos()[partition].address.rsplit(":", 1)[0]
    resources = ctx.resources()
    gpus = list(resources["gpu"].addresses) if "gpu" in resources else []
    return run_slot(spec, partition, address, gpus)


def barrier_task(spec: TaskSpec) -> Any:
    """An RDD partition function running :func:`run_barrier_slot`."""

    def task(_: Iterator[Any]) -> Iterator[int]:
        yield run_barrier_slot(spec)

    return task


class BarrierStageLaunch:
    """A :class:`~hvdrunner._launch.backends.base.Launch` of one barrier stage: run in a background
    thread (:meth:`_stage`), cancellable (:meth:`_cancel`), its error kept. Each session
    backend says how it runs and cancels its stage."""

    def __init__(self, np: int, spec: TaskSpec, thread_name: str) -> None:
        self._np = np
        self._spec = spec
        self._group = f"hvdrunner-{uuid.uuid4().hex[:12]}"  # the stage's job group or tag
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def _stage(self) -> None:
        """Run the stage to its end (in the background thread)."""
        raise NotImplementedError

    def _cancel(self) -> None:
        """Cancel the stage (from the caller's thread)."""
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._stage()
        except BaseException as exc:  # noqa: BLE001 - surfaced through error()
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def error(self) -> BaseException | None:
        return self._error

    def stop(self, cancel: bool) -> None:
        """Wait for the stage to end; cancel it first when the job failed."""
        if cancel:
            self._cancel()
        self._thread.join(timeout=30 if cancel else None)
