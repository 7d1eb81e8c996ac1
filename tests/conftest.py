"""Shared fixtures: one real local[2] SparkSession per test run, tmp MLflow and cache dirs."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

# TF's C++ banner lines are noise in test output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

WORKER_MODULE = "hvdrunner._launch.worker"


def _installed(dist: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(dist)
    except md.PackageNotFoundError:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Select by the stack's framework, decided by what is *installed*, never by an import.

    The torch stack (no TensorFlow) runs the tests marked ``torch`` and nothing else; the
    TensorFlow stacks (no torch) run everything else. A venv with both runs everything. A
    framework that is installed but broken is selected and so fails - it never skips.
    """
    has_tf, has_torch = _installed("tensorflow"), _installed("torch")
    keep, drop = [], []
    for item in items:
        is_torch = item.get_closest_marker("torch") is not None
        (keep if (has_torch if is_torch else has_tf) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    frameworks = [d for d in ("tensorflow", "torch") if _installed(d)]
    return f"hvdrunner stack frameworks: {', '.join(frameworks) or 'none'}"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from hvdrunner.spark import local_session

    session = local_session("local[2]", app_name="hvdrunner-tests")
    yield session
    session.stop()


@pytest.fixture()
def store(tmp_path: Path):
    """A real MLflow sqlite store and experiment under tmp_path; yields (tmp_path, exp id)."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("hvdrunner-tests", artifact_location=str(tmp_path / "artifacts"))
    mlflow.set_experiment(experiment_id=exp)
    yield tmp_path, exp
    left = mlflow.active_run()
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)
    # The README promises no run is left RUNNING: a test that leaves one active has found
    # that bug (ended here so the next test starts clean, then reported).
    if left is not None:
        pytest.fail(f"the test left MLflow run {left.info.run_id} active (RUNNING)")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tmp data cache (hvdrunner.data.prepare) shared by the session's tests."""
    return str(tmp_path_factory.mktemp("data-cache"))


#: Every process this test session starts inherits the marker - ranks of subprocess tests
#: (cluster, notebook CLI, demo, the multi-host hosts) too - so leftovers are found by it,
#: not by parentage (a rank whose parent died is re-parented to init).
SESSION_ENV = "HVDRUNNER_TEST_SESSION"
os.environ[SESSION_ENV] = f"{os.getpid()}-{time.time_ns()}"


def rank_processes() -> list[psutil.Process]:
    """Live hvdrunner rank processes started by this test session, anywhere on the machine."""
    out = []
    for proc in psutil.process_iter():
        try:
            if WORKER_MODULE not in " ".join(proc.cmdline()):
                continue
            if proc.environ().get(SESSION_ENV) == os.environ[SESSION_ENV]:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


@pytest.fixture(autouse=True)
def no_orphan_ranks() -> Iterator[None]:
    """Every test must leave no rank process behind, whatever it did."""
    yield
    deadline = time.monotonic() + 3  # a rank already told to stop may take a moment
    while (leftovers := rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in leftovers:
        proc.kill()
    assert not leftovers, f"rank processes left behind: {[p.pid for p in leftovers]}"
