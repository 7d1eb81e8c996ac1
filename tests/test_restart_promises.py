"""What ``max_restarts`` and ``timeout`` promise (docs/faults.md), each case on real ranks:
one ``timeout`` for the whole job, no listening socket or thread left per attempt, no
partial checkpoint folder left by a killed save, ``min_np`` counting free slots, an
unpicklable value never retried, two notebook cells failing at the same line number told
apart, a rank lost after rank 0 returned, and a rank ending with ``os._exit(0)``."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers.restart_marks import attempts_run, mark
from hvdrunner import HorovodRunner, HorovodRunnerError
from hvdrunner._launch.protocol import place_of
from hvdrunner.core.checkpoint import CheckpointDir
from hvdrunner.distributed import attempt, rank

HELPERS = Path(__file__).parent / "helpers"


# -- 1. timeout bounds the whole job ------------------------------------------------------------
def killed_after(marks: str, seconds: float) -> None:
    mark(marks)
    time.sleep(seconds)
    if rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


@pytest.mark.timeout(120)
def test_timeout_bounds_every_attempt_together(marks):
    t0 = time.monotonic()
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2, max_restarts=5, timeout=10).run(killed_after, marks=str(marks),
                                                             seconds=4)  # fmt: skip
    elapsed = time.monotonic() - t0
    # Each attempt dies after ~4 s and is restarted; the job ends at 10 s, not 5 x 4 s.
    assert elapsed < 10 + 8, elapsed
    err = info.value
    assert err.cause == "timeout" and "did not finish within timeout=10s" in err.summary
    assert 2 <= len(err.attempts) <= 3, err.attempts
    assert err.attempts[-1].endswith("not restarted: the job's own timeout bounds every "
                                     "attempt together")  # fmt: skip


# -- 2. nothing left listening ------------------------------------------------------------------
def killed_in_attempt_1(marks: str) -> int:
    mark(marks)
    if attempt() == 1:
        if rank() == 1:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    return attempt()


def _listening() -> set[tuple[str, int]]:
    proc = psutil.Process()
    # net_connections() is psutil >= 6; 15.4 to 18 LTS ML ship psutil 5.9.0 (connections())
    conns = (getattr(proc, "net_connections", None) or proc.connections)(kind="tcp")
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}


def _service_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("hvdrunner-accept", "hvdrunner-beat"))]  # fmt: skip


@pytest.mark.timeout(120)
def test_no_listening_socket_or_service_thread_outlives_its_attempt(marks):
    before = _listening()
    assert HorovodRunner(np=-2, max_restarts=3).run(killed_in_attempt_1, marks=str(marks)) == 2
    assert attempts_run(marks) == ["attempt1", "attempt2"]
    deadline = time.monotonic() + 5  # the rendezvous server stops in the background (0.5 s)
    while (_listening() - before or _service_threads()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _listening() - before == set(), "listening sockets left by the job"
    assert _service_threads() == []


# -- 3. a save killed mid-way -------------------------------------------------------------------
def _save_then_die(root: str) -> None:
    store = CheckpointDir(root, keep=3)

    def write(tmp: str) -> dict:
        with open(os.path.join(tmp, "model.bin"), "wb") as f:
            f.write(os.urandom(1 << 20))
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # mid-save, as a lost node would
        return {}

    store.save(write, epochs_done=2)


def test_a_save_killed_mid_way_leaves_no_partial_folder_once_the_job_resumes(tmp_path):
    root = tmp_path / "ckpt"
    store = CheckpointDir(str(root), keep=3)
    store.save(lambda tmp: Path(tmp, "model.bin").write_bytes(b"epoch 1") and {}, epochs_done=1)
    proc = multiprocessing.get_context("fork").Process(target=_save_then_die, args=(str(root),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    torn = [p.name for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert len(torn) == 1  # what the kill left: a partial copy of the model
    epoch, path = CheckpointDir(str(root), keep=3).latest()  # the resume
    assert epoch == 1 and Path(path, "model.bin").read_bytes() == b"epoch 1"
    assert sorted(p.name for p in root.iterdir()) == ["epoch-00001"]


# -- 4. min_np counts free slots ----------------------------------------------------------------
@pytest.mark.timeout(240)
def test_a_restart_shrinks_to_the_slots_another_job_leaves_free(tmp_path):
    out = subprocess.run([sys.executable, str(HELPERS / "shrinking_restart.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=220)  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("RESULT ", "ERROR "))]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads(lines[0][len("RESULT ") :]) == {"attempt": 2, "size": 1}


# -- 5. an unpicklable value is not retried -----------------------------------------------------
def returns_a_lock(marks: str) -> object:
    mark(marks)
    return threading.Lock()


@pytest.mark.timeout(120)
def test_an_unpicklable_return_value_is_not_trained_again(marks):
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2, max_restarts=2).run(returns_a_lock, marks=str(marks))
    assert attempts_run(marks) == ["attempt1"]
    assert info.value.cause == "result" and "cannot be pickled" in info.value.summary
    assert (
        "not restarted: rank 0's value would again not reach the driver" in info.value.attempts[0]
    )


# -- 6. two notebook cells, the same line number ------------------------------------------------
_CELL = """def {name}(step):
    total = step * {factor}
    raise ValueError(f"{name} failed at step {{total}}")
"""


def _cell(name: str, factor: int):
    """A function as a notebook cell defines it: by value, in a file named for no module."""
    namespace = {"__name__": "__main__"}
    exec(compile(_CELL.format(name=name, factor=factor), "<dynamic-code>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def fails_in_a_different_cell_each_attempt(marks: str, cells: list) -> str:
    mark(marks)
    if rank() == 1 and attempt() <= len(cells):
        cells[attempt() - 1](attempt())
    return f"attempt {attempt()}"


def test_the_place_of_an_exception_tells_cells_apart_and_knows_the_same_bug():
    def place(fn) -> str:
        try:
            fn(1)
        except ValueError as exc:
            return place_of(exc)
        raise AssertionError("no exception")

    a, b = _cell("train", 2), _cell("train", 3)
    assert place(a).startswith("ValueError at <dynamic-code>:3 in train")
    assert place(b).startswith("ValueError at <dynamic-code>:3 in train")
    assert place(a) != place(b)  # other code at the same line of another cell
    assert place(a) == place(_cell("train", 2))  # the same code raising again


@pytest.mark.timeout(180)
def test_two_cells_failing_at_the_same_line_number_are_two_failures(marks):
    cells = [_cell("prepare_batch", 2), _cell("train_step", 3)]
    value = HorovodRunner(np=-2, max_restarts=3).run(
        fails_in_a_different_cell_each_attempt, marks=str(marks), cells=cells
    )
    assert value == "attempt 3"
    assert attempts_run(marks) == ["attempt1", "attempt2", "attempt3"]


# -- 7. a rank lost after rank 0 returned -------------------------------------------------------
def rank1_killed_after_rank0_returned(marks: str) -> str:
    mark(marks)
    if rank() == 1:
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGKILL)
    return f"rank 0 of attempt {attempt()}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_restarts", [0, 2])
def test_a_rank_killed_after_rank0_returned_does_not_undo_the_job(marks, max_restarts, caplog):
    caplog.set_level(logging.WARNING, logger="hvdrunner")
    runner = HorovodRunner(np=-2, max_restarts=max_restarts)
    assert runner.run(rank1_killed_after_rank0_returned, marks=str(marks)) == "rank 0 of attempt 1"
    assert attempts_run(marks) == ["attempt1"]
    warned = [r.getMessage() for r in caplog.records if "after rank 0 returned" in r.getMessage()]
    assert len(warned) == 1 and "Rank 1 died (SIGKILL" in warned[0]


# -- 8. os._exit(0) mid-way ---------------------------------------------------------------------
def exits_zero_before_a_collective(marks: str) -> float:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    mark(marks)
    if hvd.rank() == 1:
        os._exit(0)
    return float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy())


@pytest.mark.timeout(180)
def test_a_rank_exiting_with_code_0_mid_way_is_named_and_not_restarted(marks):
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2, max_restarts=2).run(exits_zero_before_a_collective, marks=str(marks))
    err = info.value
    assert attempts_run(marks) == ["attempt1"]
    assert err.cause == "early" and err.rank == 0
    assert "Rank(s) [1] had exited with code 0 before their function returned" in err.summary
    assert "not restarted: a rank that returns or exits (code 0) early" in err.attempts[0]
