"""``HorovodRunner(max_restarts=N)``: which failed attempts start the job again, and the one
error reported when it stops. Pure rules over each attempt's :class:`HorovodRunnerError`
(its ``cause``, set by :mod:`hvdrunner._launch.driver.verdict`), testable without a job.

The policy (docs/faults.md, "Automatic restarts"):

- **restarted**: the machine or the cluster failed, not the code — a host or task lost
  (``lost``), a rank killed by a signal or exiting non-zero without a Python exception
  (``died``: a spot node reclaimed, the OOM killer, ``kill -9``, a C library's
  ``exit(1)``/``abort()``), the launch backend's job failed under the ranks
  (``backend``; on Spark: an executor died, a stage cancelled), a collective that failed because a
  peer vanished;
- **restarted once**: any other exception raised in the training function. If a later
  attempt raises the same type at the same line, the job stops: a restart would fail there
  again;
- **never restarted**: what a restart cannot fix — ``RanksOutOfSyncError``,
  ``CheckpointError``, ``CorruptDataError``, ``MultiHostSetupError``, out-of-memory errors
  raised as exceptions (``MemoryError``, CUDA/TF OOM), a stall, the job's ``timeout``,
  too few slots within ``start_timeout``, mixed horovod builds, a rank returning or
  exiting with code 0 (``os._exit(0)``) while the others still run collectives, rank 0's
  value unpicklable. Bad arguments and an unpicklable function fail before the first
  attempt.
- **not a failure**: a rank killed or lost after rank 0 returned its value: rank 0's value
  is the job's (:mod:`hvdrunner._launch.driver.service`).

Example:
    >>> err = HorovodRunnerError("Lost host h2", rank=2, cause="lost")
    >>> judge(err, [], max_restarts=1, number=1, np=4).restart
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hvdrunner.errors import Cause, HorovodRunnerError

#: Causes a restart can fix: the infrastructure failed, not the code (the driver also reads
#: it: after rank 0 returned, these do not undo the job).
INFRASTRUCTURE = {
    "lost": "a lost host or task is infrastructure",
    "died": "a rank killed by a signal (spot reclaim, OOM killer, kill) or exiting non-zero "
    "without a Python exception is infrastructure",
    "backend": "the launch backend's job failed under the ranks (on Spark: an executor lost, "
    "a stage cancelled)",
}
#: Causes a restart cannot fix, and why.
_FINAL = {
    "stall": "a stalled collective is the code's (mismatched collectives) or a too short "
    "stall_timeout",
    "timeout": "the job's own timeout bounds every attempt together",
    "start": "the ranks did not start within start_timeout",
    "builds": "mixed horovod builds stay mixed",
    "early": "a rank that returns or exits (code 0) early does so again",
    "result": "rank 0's value would again not reach the driver",
}
#: Exceptions raised by a rank that a restart cannot fix.
_NEVER_TYPES = {
    "RanksOutOfSyncError", "CheckpointError", "CorruptDataError", "MultiHostSetupError",
    "MemoryError", "OutOfMemoryError", "ResourceExhaustedError",
}  # fmt: skip
_OOM = re.compile(r"out of memory|\bOOM\b", re.IGNORECASE)
#: A raised error that only says a peer went away (gloo / Horovod shut down under it).
_PEER_GONE = ("HorovodInternalError", "Horovod has been shut down", "Connection closed by peer",
              "Connection reset by peer")  # fmt: skip
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@dataclass(frozen=True)
class Attempt:
    """One attempt that failed: its number (1-based), ranks, error, and the decision."""

    number: int
    np: int
    summary: str
    cause: Cause | None
    place: str | None  # for a raised exception: "Type at file:line" of its innermost frame
    restart: bool
    why: str

    def line(self) -> str:
        """``attempt 2 (np=4): <error> -> restarted: <why>``."""
        verb = "restarted" if self.restart else "not restarted"
        return f"attempt {self.number} (np={self.np}): {self.summary} -> {verb}: {self.why}"


def place_of(err: HorovodRunnerError) -> str | None:
    """Where a raised exception came from: the rank's own account (type, innermost line and
    a digest of the code on its stack), else its type and innermost ``file:line``."""
    if err.exc_type is None:
        return None
    if err.place:
        return err.place
    frames = _FRAME.findall(err.remote_traceback or "")
    where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else "an unknown line"
    return f"{err.exc_type} at {where}"


def _raised(err: HorovodRunnerError, earlier: Sequence[Attempt]) -> tuple[bool, str, str | None]:
    place = place_of(err)
    text = f"{err.exc_type} {err.remote_message or ''}"
    if err.exc_type in _NEVER_TYPES or _OOM.search(text):
        return False, f"{err.exc_type} is not fixed by a restart", place
    if any(sign in text for sign in _PEER_GONE):
        return True, "a collective failed because a peer went away (infrastructure)", place
    again = next((a for a in earlier if a.place is not None and a.place == place), None)
    if again is not None:
        return False, f"raised at the same place as attempt {again.number} ({place})", place
    return True, "an exception in the training function is restarted once", place


def judge(
    err: HorovodRunnerError, earlier: Sequence[Attempt], max_restarts: int, number: int, np: int
) -> Attempt:
    """The decision for attempt ``number`` that failed with ``err`` after ``earlier``."""
    cause = err.cause
    if cause == "raised":
        restart, why, place = _raised(err, earlier)
    elif cause in INFRASTRUCTURE:
        restart, why, place = True, INFRASTRUCTURE[cause], None
    else:
        restart, why, place = False, _FINAL.get(str(cause), "not a failure a restart fixes"), None
    if restart and len(earlier) >= max_restarts:
        restart, why = False, f"max_restarts={max_restarts} used up ({why})"
    return Attempt(number, np, err.summary, cause, place, restart, why)


def final_error(err: HorovodRunnerError, attempts: Sequence[Attempt]) -> HorovodRunnerError:
    """``err`` (the last attempt's) with every attempt's cause: the error ``run()`` raises."""
    before = len(attempts) - 1
    summary = (
        f"{err.summary} (attempt {len(attempts)}, after {before} restart(s); every attempt "
        f"is listed below)"
        if before
        else err.summary
    )
    return HorovodRunnerError(
        summary, rank=err.rank, exc_type=err.exc_type, remote_message=err.remote_message,
        remote_traceback=err.remote_traceback, output_tail=err.output_tail, cause=err.cause,
        attempts=[a.line() for a in attempts], place=err.place,
    )  # fmt: skip


def slots_failure(why: str) -> HorovodRunnerError:
    """A restart found too few task slots within ``start_timeout`` (``why`` names them)."""
    return HorovodRunnerError(why, cause="start")
