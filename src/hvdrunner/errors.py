"""The public exceptions of hvdrunner, in one place (each module that raises one re-exports it).

- :class:`HorovodRunnerError`: a job failed (a rank raised or died, or it could not start).
- :class:`MultiHostSetupError`: a host cannot take part in a multi-host job.
- :class:`RanksOutOfSyncError`: ranks hold different weights after a synchronized epoch.
- :class:`CheckpointError`: a checkpoint is corrupt or belongs to another model.
- :class:`CorruptDataError`: a prepared Parquet file does not read as it was written.
- :class:`NotebookError`: a notebook cell failed in the local runner.
- :class:`TrackingError`: the MLflow tracking server cannot start the job's run.
- :class:`EnvironmentCheckError`: ``hvdrunner.doctor.check()`` found a required piece missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

#: What kind of failure a job had (:attr:`HorovodRunnerError.cause`), for the restart policy.
Cause = Literal[
    "lost", "died", "raised", "early", "backend", "stall", "timeout", "start", "builds", "result"
]


class HorovodRunnerError(RuntimeError):
    """A Horovod job failed: a rank raised or died, or the job could not start.

    Attributes:
        rank: the rank that failed first (``None`` when no rank is to blame, e.g. a timeout).
        exc_type: the remote exception's type name, when the rank raised one.
        remote_message: the remote exception's message.
        remote_traceback: the remote traceback, as text.
        output_tail: the last lines of that rank's stdout/stderr.
        cause: what kind of failure it was, for the restart policy
            (:mod:`hvdrunner._launch.driver.restarts`): ``"lost"`` (a host or task vanished),
            ``"died"`` (a rank killed by a signal or exiting non-zero without an exception),
            ``"raised"``, ``"early"`` (a rank returned while others ran collectives),
            ``"backend"`` (the Spark job failed), ``"stall"``, ``"timeout"``, ``"start"``,
            ``"builds"``, ``"result"``; ``None`` when not known.
        attempts: with ``HorovodRunner(max_restarts=N)``, one line per attempt that ran
            (its cause, and why it was or was not restarted); empty otherwise.
        place: for a raised exception, where: its type, innermost ``file:line in function``
            and a digest of the code on its stack (the same bug raised twice has the same
            place; two notebook cells failing at the same line number do not).
    """

    def __init__(
        self,
        summary: str,
        *,
        rank: int | None = None,
        exc_type: str | None = None,
        remote_message: str | None = None,
        remote_traceback: str | None = None,
        output_tail: Sequence[str] = (),
        cause: Cause | None = None,
        attempts: Sequence[str] = (),
        place: str | None = None,
    ) -> None:
        self.summary = summary
        self.cause = cause
        self.place = place
        self.attempts = list(attempts)
        self.rank = rank
        self.exc_type = exc_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.output_tail = list(output_tail)
        parts = [summary]
        if self.attempts:
            parts.append("--- every attempt ---\n" + "\n".join(self.attempts))
        if remote_traceback:
            parts.append(f"\n--- remote traceback (rank {rank}) ---\n{remote_traceback.rstrip()}")
        if self.output_tail:
            parts.append(
                f"\n--- last {len(self.output_tail)} lines of rank {rank}'s output ---\n"
                + "\n".join(self.output_tail)
            )
        super().__init__("\n".join(parts))


class MultiHostSetupError(RuntimeError):
    """A host cannot take part in a job that spans several hosts (raised before its ranks
    start): e.g. its hostname resolves to loopback and horovod lacks hvdrunner's gloo
    interface patch. The message names the host, the cause and the fixes."""


class RanksOutOfSyncError(RuntimeError):
    """Ranks hold different weights after a step: gradients were not averaged."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (corrupt, or made for another model)."""


class CorruptDataError(RuntimeError):
    """A prepared Parquet file cannot be read as it was written."""


class NotebookError(RuntimeError):
    """A cell failed; the message names the notebook, cell and line."""


class TrackingError(RuntimeError):
    """The MLflow tracking server is unreachable or refused a call hvdrunner needs."""


class EnvironmentCheckError(RuntimeError):
    """``hvdrunner.doctor.check()`` found a required piece missing (each printed with its fix)."""


class HorovodInternalError(RuntimeError):
    """A collective of ``hvdrunner.hvd_torch`` (Horovod's PyTorch API on ``torch.distributed``)
    could not complete: a peer rank died, left or shut down. As in Horovod, an elastic job
    (``hvd.elastic.run``) restores its last commit when it sees one."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal that the hosts of an elastic job changed. HorovodRunner restarts a job
    whole instead (``max_restarts``); the name exists so that unchanged code that catches it
    imports."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of the elastic job changed")
        self.skip_sync = skip_sync
