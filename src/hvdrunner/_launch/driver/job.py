"""What the driver knows about a running job, updated by one handler per task message.

:class:`JobState` holds the registrations, exit reports, rank 0's value and the watchdog
states; :meth:`JobState.handle` dispatches each typed message of
:mod:`hvdrunner._launch.protocol` to its handler. The driver's loop
(:meth:`hvdrunner._launch.driver.service.DriverService.wait`) owns the clock and the verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from hvdrunner._launch.driver import restarts, verdict
from hvdrunner._launch.driver.verdict import Stall, Task
from hvdrunner._launch.protocol import (
    Committed,
    Disconnected,
    ExitReport,
    Message,
    RankState,
    Register,
    Result,
)
from hvdrunner.errors import HorovodRunnerError


class JobState:
    """Registrations, exits, rank 0's value and stalls of one job, message by message.

    Args:
        np: the number of ranks.
        assign: called once all ``np`` tasks registered, with them (hands out ranks).
        lost: the error naming the lost hosts, or ``None`` (called when a task drops).
    """

    def __init__(
        self,
        np: int,
        assign: Callable[[list[Any]], None],
        lost: Callable[[], HorovodRunnerError | None],
    ) -> None:
        self.np = np
        self._assign, self._lost = assign, lost
        self.registered: list[Any] = []
        self.assigned = False
        self.exits: dict[int, ExitReport] = {}
        self.result: bytes | None = None
        self.commit: bytes | None = None  # rank 0's last Horovod elastic commit
        self.failure: HorovodRunnerError | None = None  # decided: stop now
        self.failed_report: ExitReport | None = None  # a rank failed: verdict after the drain
        self.rank0_done: float | None = None
        self.stuck: dict[int, Stall] = {}  # rank -> where its watchdog says it is stuck
        self._builds: dict[str | None, list[str]] = {}  # horovod build -> its hosts
        self._handlers: dict[type, Callable[[Any, Any], None]] = {
            Register: self.on_register, Result: self.on_result, RankState: self.on_state,
            ExitReport: self.on_exit, Disconnected: self.on_disconnect,
            Committed: self.on_commit,
        }  # fmt: skip

    @property
    def running(self) -> bool:
        """No verdict yet and some rank has not exited."""
        return len(self.exits) < self.np and self.failure is None and self.failed_report is None

    @property
    def failing(self) -> bool:
        return self.failure is not None or self.failed_report is not None

    def handle(self, task: Task, message: Message) -> None:
        """Apply one message from ``task`` (output lines are shown by the driver, not here)."""
        self._handlers[type(message)](task, message)

    def on_register(self, task: Task, msg: Register) -> None:
        task.partition, task.host, task.address = msg.partition, msg.host, msg.address
        task.hostname, task.ip, task.port = msg.hostname, msg.ip, msg.port
        self.registered.append(task)
        self._builds[msg.horovod] = self._builds.get(msg.horovod, []) + [msg.hostname or msg.host]
        if len(self.registered) < self.np:
            return
        if len(self._builds) > 1:  # one horovod per job, or the ranks speak past each other
            self.failure = verdict.mixed_builds_failure(self._builds)
            return
        self._assign(self.registered)
        self.assigned = True

    def on_result(self, task: Task, msg: Result) -> None:
        self.result = msg.value

    def on_commit(self, task: Task, msg: Committed) -> None:
        self.commit = msg.blob

    def on_state(self, task: Task, msg: RankState) -> None:
        if msg.stuck is None:
            self.stuck.pop(msg.rank, None)
        else:  # how long, by the rank's clock, becomes since when, by ours
            since = time.monotonic() - msg.stuck.stuck_for
            self.stuck[msg.rank] = Stall(since, msg.stuck.in_library, msg.stuck.where)

    def on_exit(self, task: Task, msg: ExitReport) -> None:
        """A rank's exit report: while the job runs, and while the verdict drains the others'
        after its abort (a report that names the cause may come only then)."""
        task.exited = True
        self.exits[msg.rank] = msg
        if self._names_the_cause_better(msg):
            self.failed_report = msg
        elif msg.rank == 0 and not msg.aborted:
            self.rank0_done = time.monotonic()

    def _names_the_cause_better(self, msg: ExitReport) -> bool:
        """Whether ``msg`` names the failure's cause better than the report kept so far. The
        error is built once every rank exited, from the cause: a rank that only saw a peer go
        away (a failed collective) gives way to one that failed on its own, which may report
        later - a killed peer's socket closes before its exit is known, and under load a
        peer's own exception can reach the driver after the abort that the collective failure
        set off (its supervisor was still collecting the rank's output): that report says
        the rank was stopped, and still carries the rank's own exception."""
        kept = self.failed_report
        if kept is None:
            return msg.failed
        own = msg.failed or (msg.aborted and msg.error is not None)
        return (
            own and verdict.failed_in_a_collective(kept) and not verdict.failed_in_a_collective(msg)
        )

    def on_disconnect(self, task: Task, msg: Disconnected) -> None:
        if not task.exited and task.rank is not None:
            task.lost = True
            self.failure = self._lost()

    def late_ranks(self) -> list[int]:
        """Ranks that have not exited yet."""
        return sorted(set(range(self.np)) - set(self.exits))

    def finished_before(self, failure: HorovodRunnerError) -> bool:
        """Whether rank 0 had returned its value before another rank was killed or lost (the
        machine's failure, not the code's, does not undo a finished job)."""
        return (
            self.rank0_done is not None
            and self.result is not None
            and failure.cause in restarts.INFRASTRUCTURE
            and failure.rank != 0
        )

    def rank0_value(self) -> Any:
        """Rank 0's return value, unpickled, or the error saying why it cannot be."""
        if self.result is None:
            raise verdict.no_result_failure()
        try:
            return cloudpickle.loads(self.result)
        except Exception as exc:
            raise verdict.unpicklable_result_failure(exc) from exc
