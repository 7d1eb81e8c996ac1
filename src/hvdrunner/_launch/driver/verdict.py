"""The job's verdict when it fails: one error whose first sentence names the real cause.

Pure functions over what the driver learned (exit reports, watchdog states, lost
connections), so each rule is testable without a job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hvdrunner.errors import Cause, HorovodRunnerError

if TYPE_CHECKING:  # types only: run()'s module stays free of horovod until a job starts
    from hvdrunner._launch.protocol import ExitReport


class Task(Protocol):
    """What the job and its verdict know of one connected task (``driver._Conn``)."""

    partition: int | None
    host: str | None
    address: str | None
    hostname: str | None
    ip: str | None
    port: int | None
    rank: int | None
    exited: bool
    lost: bool

    def where(self) -> str:
        """``host (ip)`` for messages."""


@dataclass(frozen=True)
class Stall:
    """A rank's watchdog report as the driver keeps it: since when (the driver's clock),
    whether inside a framework's or Horovod's code, and where."""

    since: float
    in_library: bool
    where: str


def lost_failure(tasks: Sequence[Task]) -> HorovodRunnerError | None:
    """The error naming every host (or rank) whose task vanished before its exit report."""
    ranked = [t for t in tasks if t.rank is not None]
    lost = [t for t in ranked if t.lost]
    if not lost:
        return None
    parts = []
    for host in dict.fromkeys(t.host for t in lost):
        ranks = sorted(t.rank for t in lost if t.host == host and t.rank is not None)
        whole = len(ranks) == sum(1 for t in ranked if t.host == host)
        where = next(t.where() for t in lost if t.host == host)
        parts.append(
            f"host {where} with rank(s) {ranks}" if whole else f"rank(s) {ranks} on {where}"
        )
    return HorovodRunnerError(
        f"Lost {'; '.join(parts)} before they finished: the connection to their "
        f"task(s) dropped or fell silent (no heartbeat) without an exit report, so the "
        f"machine, its task (on Spark: its executor) or its network went away (see that "
        f"task's log and the cluster's event log). The other ranks were stopped; a rerun with the same "
        f"checkpoint_dir resumes (HorovodRunner(max_restarts=N) reruns by itself).",
        rank=min(t.rank for t in lost if t.rank is not None),
        cause="lost",
    )


def stall_failure(
    stuck: dict[int, Stall], np: int, stall_timeout: float, now: float
) -> HorovodRunnerError | None:
    """A failure when some rank waited in a framework/Horovod call past ``stall_timeout``."""
    waiting = sorted(r for r, s in stuck.items() if s.in_library and now - s.since > stall_timeout)
    if not waiting:
        return None
    others = [r for r in range(np) if r not in waiting]

    def where(r: int) -> str:
        s = stuck.get(r)
        return f"stuck {now - s.since:.0f}s at {s.where}" if s else "busy elsewhere"

    advice = (
        "Every rank must make the same collective calls in the same order (same steps per "
        "epoch, same callbacks); raise HorovodRunner(stall_timeout=...) if one step "
        "legitimately takes longer."
    )
    if others:
        return HorovodRunnerError(
            f"Rank(s) {others} did not join the collective that rank(s) {waiting} waited in "
            f"for more than stall_timeout={stall_timeout:g}s "
            f"({'; '.join(f'rank {r}: {where(r)}' for r in others)}; rank {waiting[0]} waited "
            f"at {stuck[waiting[0]].where}). {advice}",
            rank=others[0],
            cause="stall",
        )
    return HorovodRunnerError(
        f"All ranks waited inside framework or Horovod calls for more than "
        f"stall_timeout={stall_timeout:g}s ({'; '.join(f'rank {r}: {where(r)}' for r in waiting)}): "
        f"mismatched collectives (different names or order), or a step longer than the "
        f"bound. {advice}",
        cause="stall",
    )


def rank_failure(
    report: ExitReport, scrub: Callable[[str], str], exits: dict[int, ExitReport]
) -> HorovodRunnerError:
    """The error of a rank that failed on its own, with the early exit of others if real."""
    rank = report.rank
    tail = [_clip(scrub(line)) for line in report.tail]
    # A rank that returned early (exit 0) while the others still called collectives is the
    # cause of their failure, not the rank that reported it -- but only when that failure
    # is a failed collective: rank 0 failing in its own rank-0-only work at the end (an
    # unpicklable return value, MLflow logging) after the others returned is its own cause.
    cause = _early_exit(report, exits) if failed_in_a_collective(report) else ""
    err = report.error
    if err is not None:
        exc_type, message, trace = scrub(err.type), scrub(err.message), scrub(err.traceback)
        summary = (
            f"{cause}Rank {rank} failed with {exc_type}: "
            f"{_clip(message).rstrip().rstrip('.')}. The other ranks were stopped."
        )
        kind: Cause = "early" if cause else "result" if err.stage == "result" else "raised"
        return HorovodRunnerError(
            summary, rank=rank, exc_type=exc_type, remote_message=message,
            remote_traceback=trace, output_tail=tail, cause=kind, place=err.place,
        )  # fmt: skip
    return HorovodRunnerError(
        f"{cause}Rank {rank} died ({report.how}) without raising a Python exception. "
        f"The other ranks were stopped.",
        rank=rank,
        output_tail=tail,
        cause="early" if cause else "died",
    )


def _early_exit(report: ExitReport, exits: dict[int, ExitReport]) -> str:
    """The sentence naming the ranks that ended with exit code 0 while the others still ran
    collectives (they caused ``report``'s failure), or ``""``."""
    early = {r: e for r, e in exits.items() if e.code == 0 and not e.aborted and r != report.rank}
    if not early:
        return ""
    returned = sorted(r for r, e in early.items() if e.returned)
    exited = sorted(r for r, e in early.items() if not e.returned)
    said = []
    if returned:
        said.append(f"Rank(s) {returned} had already returned (exit code 0)")
    if exited:
        said.append(
            f"rank(s) {exited} had exited with code 0 before their function returned "
            f"(os._exit(0) or a library ending the process)"
        )
    text = "; ".join(said)
    return (
        f"{text[0].upper()}{text[1:]} while the others were still running collectives: every "
        f"rank must run the same steps. "
    )


#: What a rank's error or output shows when a collective failed under it (a peer left).
_COLLECTIVE_SIGNS = ("Horovod has been shut down", "HorovodInternalError", "gloo",
                     "Connection closed by peer", "Connection reset by peer")  # fmt: skip


def failed_in_a_collective(report: ExitReport) -> bool:
    """Whether the rank failed because a collective failed under it (a peer went away)."""
    err = report.error
    said = [err.type, err.message] if err is not None else []
    text = " ".join([*said, *report.tail[-20:]])
    return any(sign in text for sign in _COLLECTIVE_SIGNS)


def _clip(message: str, limit: int = 2000) -> str:
    """A huge exception message once, shortened: the full text is in the traceback part."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... [{len(message) - limit} more characters in the traceback below]"


# -- the job's limits and the launch: one sentence each, the fix included -----------------
def timeout_failure(timeout: float) -> HorovodRunnerError:
    return HorovodRunnerError(
        f"The job did not finish within timeout={timeout:g}s and was stopped. "
        f"Raise HorovodRunner(timeout=...) if it needs longer.",
        cause="timeout",
    )


def backend_failure(err: BaseException) -> HorovodRunnerError:
    return HorovodRunnerError(
        f"The launch backend failed before all ranks finished: {type(err).__name__}: {err}",
        cause="backend",
    )


def start_failure(started: int, np: int, start_timeout: float) -> HorovodRunnerError:
    return HorovodRunnerError(
        f"Only {started} of np={np} ranks started within start_timeout={start_timeout:g}s. "
        f"The cluster probably has no {np} free task slots at once (other jobs, or executors "
        f"still starting). Free slots, lower np, or raise start_timeout.",
        cause="start",
    )


def mixed_builds_failure(builds: dict[str | None, list[str]]) -> HorovodRunnerError:
    """The hosts run different horovod builds (``{build: [host, ...]}``)."""
    hosts = "; ".join(f"{build}: {', '.join(sorted(set(h)))}" for build, h in builds.items())
    return HorovodRunnerError(
        f"The hosts of this job have different horovod builds ({hosts}). Every node "
        f"must install the same horovod wheel (the bundle's task library, built once "
        f"by hvdrunner_build_horovod); restart the cluster after fixing its libraries.",
        cause="builds",
    )


def no_result_failure() -> HorovodRunnerError:
    return HorovodRunnerError(
        "Rank 0 finished without sending its return value.", rank=0, cause="result"
    )


def unpicklable_result_failure(exc: BaseException) -> HorovodRunnerError:
    return HorovodRunnerError(
        f"Rank 0's return value could not be unpickled on the driver "
        f"({type(exc).__name__}: {exc}). Return plain data (numbers, dicts, numpy "
        f"arrays) rather than objects of modules the driver cannot import.",
        rank=0,
        cause="result",
    )


def late_ranks_warning(ranks: Sequence[int], exit_grace: float) -> str:
    """Not a failure: ranks still running ``exit_grace`` after rank 0 returned."""
    return (
        f"rank(s) {list(ranks)} still running {exit_grace:g}s (exit_grace) after rank 0 "
        f"returned; stopping them. Rank 0's value is returned. A rank that keeps working "
        f"after training (an endless loop, a thread that is not a daemon) is the usual cause."
    )


def lost_after_rank0_warning(failure: HorovodRunnerError) -> str:
    """Not a failure: a rank killed or lost after rank 0 had returned its value."""
    return (
        f"after rank 0 returned its value: {failure.summary} Rank 0's value is the job's "
        f"value and is returned; nothing is restarted."
    )
