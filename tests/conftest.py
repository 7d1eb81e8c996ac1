"""Shared fixtures: one real local[2] SparkSession per test run, tmp MLflow and cache dirs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

# TF's C++ banner lines are noise in test output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

WORKER_MODULE = "hvdrunner._launch.worker"


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
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tmp data cache (hvdrunner.data.prepare) shared by the session's tests."""
    return str(tmp_path_factory.mktemp("data-cache"))


def rank_processes() -> list[psutil.Process]:
    """Live hvdrunner rank processes anywhere below this test process."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if WORKER_MODULE in " ".join(proc.cmdline()):
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@pytest.fixture(autouse=True)
def no_orphan_ranks() -> Iterator[None]:
    """Every test must leave no rank process behind, whatever it did."""
    yield
    leftovers = rank_processes()
    for proc in leftovers:
        proc.kill()
    assert not leftovers, f"rank processes left behind: {[p.pid for p in leftovers]}"
