"""HorovodRunner(max_restarts=N): a job outlives a killed rank on its own, on real gloo ranks
(driver processes) and real Spark local[2] barrier tasks; what a restart cannot fix is
reported once with every attempt's cause; the MLflow run records the restarts and never
stays RUNNING. The policy's rules are checked as pure functions first."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import mlflow
import pytest

from helpers.restart_marks import attempts_run, mark
from hvdrunner import HorovodRunner, HorovodRunnerError, RanksOutOfSyncError
from hvdrunner._launch.driver.restarts import Attempt, final_error, judge
from hvdrunner.distributed import attempt, rank

#: A killed rank ends its attempt within seconds (docs/faults.md); a restart adds a launch.
RESTART_BOUND_S = 60.0


# -- the policy, as pure rules ---------------------------------------------------------------
def _raised(exc_type: str, line: int, message: str = "boom") -> HorovodRunnerError:
    trace = f'Traceback:\n  File "/w/train.py", line {line}, in train\n{exc_type}: {message}'
    return HorovodRunnerError(f"Rank 1 failed with {exc_type}: {message}", rank=1,
                              exc_type=exc_type, remote_message=message, remote_traceback=trace,
                              cause="raised")  # fmt: skip


@pytest.mark.parametrize("cause", ["lost", "died", "backend"])
def test_infrastructure_failures_are_restarted_until_max_restarts(cause):
    err = HorovodRunnerError("it failed", rank=1, cause=cause)
    first = judge(err, [], max_restarts=2, number=1, np=2)
    second = judge(err, [first], max_restarts=2, number=2, np=2)
    third = judge(err, [first, second], max_restarts=2, number=3, np=2)
    assert (first.restart, second.restart, third.restart) == (True, True, False)
    assert "max_restarts=2 used up" in third.why


@pytest.mark.parametrize("cause", ["stall", "timeout", "start", "builds", "early", "result", None])
def test_failures_a_restart_cannot_fix_are_never_restarted(cause):
    assert not judge(HorovodRunnerError("x", cause=cause), [], 5, 1, 2).restart


@pytest.mark.parametrize("exc_type,message", [
    ("RanksOutOfSyncError", "weights differ"), ("CheckpointError", "corrupt"),
    ("CorruptDataError", "bad file"), ("MemoryError", ""), ("MultiHostSetupError", "lo"),
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("ResourceExhaustedError", "OOM when allocating tensor"),
    ("RuntimeError", "CUDA error: out of memory"),
])  # fmt: skip
def test_exceptions_a_restart_cannot_fix_are_never_restarted(exc_type, message):
    decision = judge(_raised(exc_type, 7, message), [], 5, 1, 2)
    assert not decision.restart and exc_type in decision.why


def test_an_exception_is_restarted_once_and_stops_when_it_recurs_at_the_same_place():
    first = judge(_raised("ValueError", 7), [], 5, 1, 2)
    assert first.restart and first.place == "ValueError at /w/train.py:7"
    elsewhere = judge(_raised("ValueError", 9), [first], 5, 2, 2)
    assert elsewhere.restart  # a different place: a new failure
    again = judge(_raised("ValueError", 7), [first, elsewhere], 5, 3, 2)
    assert not again.restart and "same place as attempt 1" in again.why


def test_a_collective_that_failed_because_a_peer_left_is_infrastructure():
    err = _raised("HorovodInternalError", 7, "Horovod has been shut down")
    first = judge(err, [], 5, 1, 2)
    assert judge(err, [first], 5, 2, 2).restart  # not "the same place twice"


def test_the_final_error_keeps_the_last_cause_first_and_lists_every_attempt():
    a1 = Attempt(1, 4, "Lost host h2 ...", "lost", None, True, "infrastructure")
    err = _raised("ValueError", 7)
    a2 = judge(err, [a1], 1, 2, 4)
    final = final_error(err, [a1, a2])
    assert final.summary.startswith("Rank 1 failed with ValueError: boom (attempt 2, after 1")
    assert final.rank == 1 and final.exc_type == "ValueError" and final.cause == "raised"
    assert final.attempts[0].startswith("attempt 1 (np=4): Lost host h2 ... -> restarted")
    assert "attempt 2 (np=4): Rank 1 failed with ValueError" in str(final)
    assert "max_restarts=1 used up" in final.attempts[1]


@pytest.mark.parametrize("kwargs,fragment", [
    ({"max_restarts": -1}, "max_restarts must be an int >= 0"),
    ({"max_restarts": True}, "max_restarts must be an int >= 0"),
    ({"max_restarts": 1.5}, "max_restarts must be an int >= 0"),
    ({"min_np": 1}, "pass max_restarts=N"),
    ({"min_np": 0, "max_restarts": 1}, "min_np must be None or an int >= 1"),
    ({"min_np": 3, "max_restarts": 1}, "min_np <= np"),
    ({"np": -2, "min_np": 1, "max_restarts": 1}, "needs np > 0"),
])  # fmt: skip
def test_bad_restart_arguments_are_refused_naming_the_argument(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        HorovodRunner(**{"np": 2, **kwargs})


# -- functions that run on the ranks ---------------------------------------------------------
def killed_in_attempt_1(marks: str) -> dict:
    """Rank 1 of attempt 1 is SIGKILLed while rank 0 still works; later attempts succeed."""
    mark(marks)
    if attempt() == 1:
        if rank() == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # rank 0 keeps working until the driver stops it
    return {"attempt": attempt(), "rank": rank(), "pid": os.getpid()}


def killed_every_time(marks: str) -> None:
    mark(marks)
    if rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


def raises_at_the_same_line(marks: str) -> None:
    mark(marks)
    if rank() == 1:
        raise ValueError(f"bad value in attempt {attempt()}")
    time.sleep(120)


def out_of_sync(marks: str) -> None:
    mark(marks)
    if rank() == 1:
        raise RanksOutOfSyncError("rank 1 holds other weights")
    time.sleep(120)


# -- real jobs ---------------------------------------------------------------------------------
@pytest.mark.timeout(180)
@pytest.mark.parametrize("np_", [-2, 2], ids=["driver-processes", "spark-barrier-tasks"])
def test_a_sigkilled_rank_is_restarted_and_the_job_returns_rank0s_value(spark, np_, marks, caplog):
    caplog.set_level(logging.INFO, logger="hvdrunner")
    t0 = time.monotonic()
    value = HorovodRunner(np=np_, max_restarts=2).run(killed_in_attempt_1, marks=str(marks))
    assert time.monotonic() - t0 < RESTART_BOUND_S
    assert value["attempt"] == 2 and value["rank"] == 0
    assert attempts_run(marks) == ["attempt1", "attempt2"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    restart = [w for w in warnings if w.startswith("restarting the job")]
    assert len(restart) == 1 and "restart 1 of at most 2" in restart[0]
    assert "Rank 1 died (SIGKILL" in restart[0] and "-> restarted" in restart[0]
    assert any("finished on attempt 2, after 1 restart(s)" in r.getMessage()
               for r in caplog.records)  # fmt: skip


@pytest.mark.timeout(180)
def test_the_same_exception_twice_is_reported_once_with_every_attempts_cause(marks, store):
    with mlflow.start_run() as run, pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2, max_restarts=3).run(raises_at_the_same_line, marks=str(marks))
    err = info.value
    # Restarted once, then stopped (3 allowed): the same line raised again.
    assert attempts_run(marks) == ["attempt1", "attempt2"]
    assert err.summary.startswith("Rank 1 failed with ValueError: bad value in attempt 2")
    assert err.exc_type == "ValueError" and err.rank == 1 and len(err.attempts) == 2
    assert "bad value in attempt 1" in err.attempts[0] and "-> restarted" in err.attempts[0]
    assert "-> not restarted: raised at the same place as attempt 1" in err.attempts[1]
    assert str(err).count("--- every attempt ---") == 1
    finished = mlflow.get_run(run.info.run_id)
    assert finished.info.status == "FAILED"
    assert finished.data.tags["hvdrunner.restarts"] == "1"
    assert "bad value in attempt 1" in finished.data.tags["hvdrunner.attempt.1"]


@pytest.mark.timeout(120)
def test_a_failure_a_restart_cannot_fix_is_not_restarted(marks):
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2, max_restarts=3).run(out_of_sync, marks=str(marks))
    assert attempts_run(marks) == ["attempt1"]
    assert info.value.exc_type == "RanksOutOfSyncError"
    assert info.value.attempts == [
        f"attempt 1 (np=2): {info.value.summary} -> not restarted: RanksOutOfSyncError is "
        f"not fixed by a restart"
    ]


@pytest.mark.timeout(180)
def test_used_up_restarts_end_the_run_failed_listing_each_attempt(marks, store):
    with mlflow.start_run() as run, pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2, max_restarts=1).run(killed_every_time, marks=str(marks))
    assert attempts_run(marks) == ["attempt1", "attempt2"]
    assert [a.split(" -> ")[1].split(":")[0] for a in info.value.attempts] == [
        "restarted", "not restarted"]  # fmt: skip
    assert "max_restarts=1 used up" in info.value.attempts[1]
    assert mlflow.get_run(run.info.run_id).info.status == "FAILED"


@pytest.mark.timeout(180)
def test_a_restarted_job_ends_its_mlflow_run_finished_with_the_restart_recorded(marks, store):
    with mlflow.start_run() as run:
        HorovodRunner(np=-2, max_restarts=2).run(killed_in_attempt_1, marks=str(marks))
    got = mlflow.get_run(run.info.run_id)
    assert got.info.status == "FINISHED"
    assert got.data.tags["hvdrunner.restarts"] == "1"
    assert "Rank 1 died (SIGKILL" in got.data.tags["hvdrunner.attempt.1"]
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "hvdrunner.restarts")
    assert [(m.step, m.value) for m in history] == [(1, 1.0)]


@pytest.mark.timeout(300)
def test_concurrent_jobs_keep_their_slots_and_a_restart_takes_none_of_another_jobs(tmp_path):
    """local[4]: two jobs of np=2 at once from two threads, one of them restarting, both
    right; a third waits for free slots and starts when they free."""
    import subprocess
    import sys

    script = Path(__file__).parent / "helpers" / "concurrent_jobs.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=280)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("JOB ")]
    got = {line.split()[1]: line.split(maxsplit=2)[2] for line in lines}
    assert got["a"] == "ok 2.0", got
    assert got["b"] == "ok 6.0 attempt=2", got
    assert got["c"].startswith("ok 4.0 waited="), got
    assert float(got["c"].split("waited=")[1]) > 1.0  # it queued behind a and b
