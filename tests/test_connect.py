"""HorovodRunner from a Spark Connect session (the Connect launch backend): Horovod's
PyTorch recipe (on hvdrunner's engine), ``prepare()`` and the converter, ``fit`` restarted after a SIGKILL
into one MLflow run, a failing rank named with its exception, two concurrent jobs, and what
a Connect client cannot serve refused before launch. A real Connect server (its own JVM, local[2]) and real ranks
over gloo; the test process talks to Spark only through the Connect client."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from conftest import rank_processes
from helpers.connect_server import connect_session
from helpers.docblocks import block
from hvdrunner import HorovodRunner, HorovodRunnerError
from test_restarts_fit import TORCH_FIT, prepared_digits, torch_fit_with_fault
from test_torch_recipe import linear_data, standard_recipe

pytestmark = pytest.mark.torch
DOC = Path(__file__).resolve().parents[1] / "docs" / "connect.md"


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    """A Connect client session to a fresh local[2] server, active while the module runs."""
    with connect_session(tmp_path_factory.mktemp("connect")) as session:
        yield session


@pytest.fixture(scope="module")
def digits(connect, tmp_path_factory):
    """prepare() on a Connect DataFrame: equal shards, verified like the classic path's."""
    return prepared_digits(connect, str(tmp_path_factory.mktemp("digits")))


def _launched_over_connect(caplog: pytest.LogCaptureFixture) -> bool:
    return any("over Spark Connect (local[2])" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(240)
def test_the_unchanged_recipe_runs_from_a_connect_session(connect, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hvdrunner")
    x, y = linear_data()
    out = HorovodRunner(np=2).run(standard_recipe, ckpt=str(tmp_path / "m.pt"), batch=16,
                                  rows=x, targets=y, epochs=2)  # fmt: skip
    assert _launched_over_connect(caplog)
    rank0, rank1 = out["every_rank"]
    for a, b in zip(rank0, rank1, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))  # bit-identical on both ranks
    assert not np.allclose(np.array(rank0[0]), np.array(out["initial"][0]), atol=1e-3)


def test_prepare_from_connect_writes_equal_verified_shards(digits):
    assert digits.num_rows == 1024 and sum(n for _, n in digits.files) == 1024
    assert [c.name for c in digits.columns] == ["pixels", "label"]


def test_the_converter_from_connect_reads_every_row(connect, tmp_path):
    from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter

    connect.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}")
    frame = connect.createDataFrame(pd.DataFrame({"x": np.arange(40.0), "y": np.arange(40)}))
    converter = make_spark_converter(frame)
    assert len(converter) == 40
    with converter.make_torch_dataloader(batch_size=8, num_epochs=1) as loader:
        seen = sorted(float(v) for batch in loader for v in batch["x"])
    assert seen == list(np.arange(40.0))


@pytest.mark.timeout(300)
def test_fit_restarts_after_a_sigkill_into_one_finished_run(connect, digits, store, tmp_path):
    with mlflow.start_run() as run:
        result = HorovodRunner(np=2, max_restarts=1).run(
            torch_fit_with_fault, fault="rank1-in-epoch4", data=digits,
            checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2, **TORCH_FIT,
        )  # fmt: skip
    assert result.initial_epoch == 2 and result.num_ranks == 2
    got = mlflow.get_run(run.info.run_id)
    assert got.info.status == "FINISHED" and got.data.tags["hvdrunner.restarts"] == "1"
    assert "SIGKILL" in got.data.tags["hvdrunner.attempt.1"]
    assert result.history["accuracy"][-1] > 0.8


def fails_on_rank1() -> int:
    import hvdrunner.hvd_torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad shard on rank 1")
    hvd.allreduce_(__import__("torch").zeros(1), name="never-completes")
    return 0


@pytest.mark.timeout(120)
def test_a_failing_rank_is_named_with_its_exception_and_the_stage_is_interrupted(connect):
    started = time.monotonic()
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=2, stall_timeout=60).run(fails_on_rank1)
    assert info.value.rank == 1 and "ValueError: bad shard on rank 1" in str(info.value)
    assert time.monotonic() - started < 60  # the failure, not the stall bound, ended it
    # The interrupted stage gave its slots back: the next job starts at once.
    assert HorovodRunner(np=2).run(os.getpid) > 0


def sleeps_then_says(seconds: float, word: str) -> str:
    time.sleep(seconds)
    print(f"streamed: {word}", flush=True)
    return word


def fails_at_once() -> None:
    raise RuntimeError("job A fails")


@pytest.mark.timeout(120)
def test_two_concurrent_jobs_a_failure_interrupts_only_its_own_stage(connect, capfd):
    """Two jobs of one Connect session at once (np=1 each, local[2]): A fails and its
    stage is interrupted by A's tag; B, still running, finishes and its output streams."""
    import threading

    results: dict[str, object] = {}

    def job_b() -> None:
        runner = HorovodRunner(np=1, driver_log_verbosity="all")
        results["b"] = runner.run(sleeps_then_says, seconds=4.0, word="job B")

    thread = threading.Thread(target=job_b)
    thread.start()
    deadline = time.monotonic() + 60  # B's rank runs (its stage holds one slot): seen, not slept
    while not rank_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rank_processes(), "job B's rank never started"
    with pytest.raises(HorovodRunnerError, match="RuntimeError: job A fails"):
        HorovodRunner(np=1).run(fails_at_once)
    thread.join(timeout=60)
    assert results.get("b") == "job B"
    assert "streamed: job B" in capfd.readouterr().out


@pytest.mark.parametrize(
    "runner,error",
    [
        (lambda: HorovodRunner(np=3), "np=3 needs 3 Spark tasks at once, but the cluster offers 2"),
        (
            lambda: HorovodRunner(np=2, max_restarts=1, min_np=1),
            "min_np=1 needs the cluster's free task slots, which a Spark Connect session cannot",
        ),
    ],
    ids=["too-many-ranks", "min_np"],
)
def test_what_connect_cannot_serve_is_refused_before_launch(connect, runner, error):
    started = time.monotonic()
    with pytest.raises(ValueError, match=error):
        runner().run(os.getpid)
    assert time.monotonic() - started < 10


@pytest.mark.timeout(120)
def test_the_docs_example_runs_over_connect(connect, caplog):
    caplog.set_level(logging.INFO, logger="hvdrunner")
    code = block("connect.md", "connect-example")
    scope: dict = {"spark": connect, "__name__": "__main__"}  # train pickled by value
    exec(compile(code, str(DOC), "exec"), scope)  # noqa: S102 - the page's own code
    assert scope["result"] == pytest.approx(0.2) and _launched_over_connect(caplog)
