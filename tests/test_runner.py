"""HorovodRunner end to end: real Spark local[2] barrier tasks and real gloo ranks."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hvdrunner import HorovodRunner, HorovodRunnerError, log_to_driver


# -- functions that run on the ranks (module level: cloudpickle sends them by reference) ----
def env_report() -> dict:
    import horovod.tensorflow as hvd

    hvd.init()
    keys = [
        "HOROVOD_RANK",
        "HOROVOD_LOCAL_RANK",
        "HOROVOD_SIZE",
        "HOROVOD_GLOO_IFACE",
        "CUDA_VISIBLE_DEVICES",
        "KERAS_BACKEND",
    ]
    return hvd.allgather_object({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()})


def chatty(flag_dir: str) -> str:
    """Print, then wait until the driver has shown both ranks' lines (live streaming)."""
    rank = os.environ["HOROVOD_RANK"]
    print(f"hello-from-rank-{rank}", flush=True)
    log_to_driver(f"callback-message-{rank}")
    flag = Path(flag_dir) / "seen"
    deadline = time.monotonic() + 60
    while not flag.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the driver never showed the lines while the job ran")
        time.sleep(0.1)
    return "done"


def fail_on_rank1(how: str) -> None:
    import torch  # the engine, every stack's default: the launcher's to see, fastest to import

    import hvdrunner.hvd_torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        print("rank 1 is about to fail", flush=True)
        if how == "raise":
            raise ValueError("boom on rank 1")
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # rank 0 blocks in collectives: without the abort it would hang forever
        hvd.allreduce(torch.tensor(1.0))


def big_result(nbytes: int) -> bytes:
    return b"x" * nbytes if os.environ["HOROVOD_RANK"] == "0" else b""


def sleep_forever() -> None:
    time.sleep(3600)


# -- tests --------------------------------------------------------------------------------
@pytest.mark.stacks("15.4", "18")  # barrier tasks on Spark 3.5 and 4.1
def test_rank_environment_on_spark(spark, monkeypatch):
    # Set in the notebook after Spark's executors started: the ranks still see it.
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    envs = HorovodRunner(np=2).run(env_report)
    assert {e["KERAS_BACKEND"] for e in envs} == {"tensorflow"}
    assert sorted(e["HOROVOD_RANK"] for e in envs) == ["0", "1"]
    assert {e["HOROVOD_SIZE"] for e in envs} == {"2"}
    assert sorted(e["HOROVOD_LOCAL_RANK"] for e in envs) == ["0", "1"]  # one host
    assert all(e["HOROVOD_GLOO_IFACE"] for e in envs)
    assert envs[0]["pid"] != envs[1]["pid"]
    assert all(e["CUDA_VISIBLE_DEVICES"] is None for e in envs)  # CPU: nothing pinned


def test_local_mode_spreads_driver_gpus(monkeypatch):
    # No GPU here: CUDA_VISIBLE_DEVICES stands in for the driver's GPUs (ranks only read it).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    envs = HorovodRunner(np=-2).run(env_report)
    by_rank = {e["HOROVOD_LOCAL_RANK"]: e["CUDA_VISIBLE_DEVICES"] for e in envs}
    assert by_rank == {"0": "0", "1": "1"}


def test_return_value_of_100_mb(spark):
    value = HorovodRunner(np=2).run(big_result, nbytes=100 * 1024 * 1024)
    assert len(value) == 100 * 1024 * 1024


class _Watcher(io.TextIOBase):
    """Stands in for the notebook's stdout: records lines and raises a flag when both show."""

    def __init__(self, flag_dir: Path, wanted: list[str]) -> None:
        self.lines: list[str] = []
        self._flag_dir = flag_dir
        self._wanted = wanted
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            self.lines.extend(s.splitlines())
            if all(any(w in line for line in self.lines) for w in self._wanted):
                (self._flag_dir / "seen").touch()
        return len(s)


@pytest.mark.timeout(120)
def test_all_verbosity_streams_both_ranks_live(spark, tmp_path, monkeypatch):
    watcher = _Watcher(
        tmp_path, ["[0]<stdout>: hello-from-rank-0", "[1]<stdout>: hello-from-rank-1"]
    )
    monkeypatch.setattr(sys, "stdout", watcher)
    assert (
        HorovodRunner(np=2, driver_log_verbosity="all").run(chatty, flag_dir=str(tmp_path))
        == "done"
    )
    assert "[1] callback-message-1" in watcher.lines


@pytest.mark.timeout(120)
def test_log_callback_only_shows_only_log_to_driver(tmp_path, monkeypatch):
    watcher = _Watcher(tmp_path, ["[0] callback-message-0", "[1] callback-message-1"])
    monkeypatch.setattr(sys, "stdout", watcher)
    HorovodRunner(np=-2, driver_log_verbosity="log_callback_only").run(
        chatty, flag_dir=str(tmp_path)
    )
    assert not any("hello-from-rank" in line for line in watcher.lines)


@pytest.mark.timeout(90)  # without the abort, rank 0 blocks forever: this bound catches a hang
@pytest.mark.stacks("15.4", "18")
@pytest.mark.parametrize("np_", [2, -2], ids=["spark-barrier", "driver-processes"])
def test_rank1_exception_fails_fast_and_names_rank(spark, np_):
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=np_).run(fail_on_rank1, how="raise")
    err = info.value
    assert err.rank == 1
    assert err.exc_type == "ValueError"
    assert err.remote_message == "boom on rank 1"
    assert "fail_on_rank1" in err.remote_traceback
    assert any("rank 1 is about to fail" in line for line in err.output_tail)
    assert "Rank 1 failed with ValueError: boom on rank 1" in str(err)


@pytest.mark.timeout(90)
def test_rank1_sigkill_fails_fast(spark):
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=2).run(fail_on_rank1, how="kill")
    assert info.value.rank == 1
    assert "SIGKILL" in str(info.value)
    assert any("rank 1 is about to fail" in line for line in info.value.output_tail)


@pytest.mark.stacks("15.4", "18")
def test_np_above_task_slots_is_refused_before_launch(spark):
    with pytest.raises(ValueError, match=r"np=3 .* 2 task slots"):
        HorovodRunner(np=3).run(big_result, nbytes=1)


@pytest.mark.timeout(120)
def test_start_timeout_when_slots_are_busy(spark):
    sc = spark.sparkContext
    sc_job = threading.Thread(target=lambda: _occupy_slots(sc), daemon=True)
    sc_job.start()
    try:
        deadline = time.monotonic() + 30
        while not sc.statusTracker().getActiveStageIds() and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(HorovodRunnerError, match="start_timeout=3s"):
            HorovodRunner(np=2, start_timeout=3).run(big_result, nbytes=1)
    finally:
        sc.cancelJobGroup("occupy-slots")
        sc_job.join(timeout=30)


def _occupy_slots(sc) -> None:
    sc.setJobGroup("occupy-slots", "keeps both cores busy", True)
    try:
        sc.parallelize(range(2), 2).foreach(lambda _: time.sleep(120))
    except Exception:  # noqa: BLE001 - cancelled on purpose
        pass


def test_unpicklable_function_is_named_before_launch(spark):
    lock = threading.Lock()

    def train():
        with lock:
            return spark.version

    with pytest.raises(ValueError, match=r"cannot be pickled.*closure variable '(lock|spark)'"):
        HorovodRunner(np=2).run(train)


@pytest.mark.parametrize("bad", [1.5, "2", True, None])
def test_bad_np_is_refused(bad):
    with pytest.raises(ValueError, match="np"):
        HorovodRunner(np=bad)


def test_bad_verbosity_and_timeout_are_refused():
    with pytest.raises(ValueError, match="driver_log_verbosity"):
        HorovodRunner(np=2, driver_log_verbosity="loud")
    with pytest.raises(ValueError, match="start_timeout"):
        HorovodRunner(np=2, start_timeout=0)


def fit_with_log_callback() -> None:
    import tensorflow as tf

    import hvdrunner.hvd_keras as hvd
    from hvdrunner.keras import LogCallback

    hvd.init()
    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss="mse")
    x = np.ones((8, 2), dtype="float32")
    model.fit(x, x[:, :1], epochs=2, batch_size=4, verbose=0, callbacks=[LogCallback()])


@pytest.mark.keras
@pytest.mark.keras_mode  # the callback's base class is the mode's Keras
def test_log_callback_reaches_driver_in_log_callback_only_mode(capsys):
    HorovodRunner(np=-2, driver_log_verbosity="log_callback_only").run(fit_with_log_callback)
    out = capsys.readouterr().out.splitlines()
    epochs = [line for line in out if line.startswith("[0] epoch ")]
    assert [e.split(":")[0] for e in epochs] == ["[0] epoch 1", "[0] epoch 2"]
    assert "loss: " in epochs[0]
    assert not any(line.startswith("[1] epoch") for line in out)  # rank 0 only


def return_a_lock():
    import threading

    return threading.Lock()


def test_unpicklable_return_value_is_a_clear_error():
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2).run(return_a_lock)
    assert info.value.rank == 0 and info.value.exc_type == "TypeError"
    assert "return value of rank 0 (lock) cannot be pickled" in info.value.remote_message


@pytest.mark.timeout(90)
def test_interrupting_run_stops_every_rank():
    # A notebook's "Cancel" raises KeyboardInterrupt in run(); no rank may outlive it
    # (the autouse no_orphan_ranks fixture checks after the test).
    import _thread

    from conftest import rank_processes

    def interrupt_when_running():
        deadline = time.monotonic() + 60
        while len(rank_processes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        HorovodRunner(np=-2).run(sleep_forever)
    deadline = time.monotonic() + 15
    while rank_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rank_processes() == []


@pytest.mark.stacks("15.4", "18")  # task slots as each Spark reports them
def test_np_zero_uses_every_task_slot_like_sparkdl(spark, capsys):
    envs = HorovodRunner(np=0).run(env_report)
    assert sorted(e["HOROVOD_RANK"] for e in envs) == ["0", "1"]  # local[2]: two slots
    assert "np=0: using all 2 task slots" in capsys.readouterr().err


def loaded_frameworks() -> list[str]:
    import sys

    return sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "torch")
                  or m.startswith("hvdrunner.keras"))  # fmt: skip


def test_a_rank_loads_no_framework_before_user_code():
    # A PyTorch (or plain Python) job must not pay for TensorFlow/Keras in every rank: the
    # rank entry point and its Keras import guard are framework-free leaves.
    assert HorovodRunner(np=-1).run(loaded_frameworks) == []
