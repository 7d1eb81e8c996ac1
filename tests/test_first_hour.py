"""A Databricks user's first hour, as far as this machine can show it: the notebooks'
defaults on a Databricks-like driver (the session's current catalog and schema, the user's
workspace folder; no ``main`` catalog), and a task retry of the training notebook that
continues its MLflow run from the first try's checkpoint (the notebook killed mid-training,
then run again with the same ``run_key``, as the bundle's job does with ``{{job.run_id}}``).
The workspace itself is what cannot exist here: ``DATABRICKS_RUNTIME_VERSION`` is set and
``/Volumes`` is a temporary folder (``HVDRUNNER_VOLUMES_ROOT``)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdrunner import _paths
from hvdrunner.notebook import default_dir, default_experiment, storage_root

pytestmark = pytest.mark.background  # no time bound (tests/conftest.py)
ROOT = Path(__file__).resolve().parents[1]


def test_no_notebook_or_default_assumes_a_main_catalog():
    for path in [*ROOT.joinpath("notebooks").glob("*.py"), *ROOT.joinpath("src").rglob("*.py")]:
        assert "/Volumes/main/" not in path.read_text(), path


def test_databricks_defaults_come_from_the_session_and_the_user(spark, monkeypatch, tmp_path,
                                                                caplog):  # fmt: skip
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "18.0")
    monkeypatch.setenv("HVDRUNNER_VOLUMES_ROOT", str(tmp_path / "Volumes"))
    catalog, schema = spark.catalog.currentCatalog(), spark.catalog.currentDatabase()
    user = spark.sql("SELECT current_user()").first()[0]
    volume = tmp_path / "Volumes" / catalog / schema / "hvdrunner"
    # A default is only a string until it is used: a job that passes its own folders while
    # the current schema has no volume hears nothing.
    with caplog.at_level(logging.WARNING, logger="hvdrunner"):
        assert default_dir("cache") == f"{volume}/cache"
        assert storage_root() == str(volume)
    assert caplog.text == ""
    # Writing into a volume that does not exist names the statement that creates it, and the
    # one line that finds the README's volume instead.
    monkeypatch.setattr(_paths, "VOLUMES_MOUNT", str(tmp_path / "Volumes"))
    (tmp_path / "Volumes").mkdir()
    uc = tmp_path / "Volumes" / "ml" / "team_a" / "hvdrunner"
    with pytest.raises(ValueError, match="CREATE VOLUME ml.team_a.hvdrunner") as info:
        _paths.ensure_writable(f"{uc}/cache")
    assert "USE CATALOG <catalog>" in str(info.value)
    uc.mkdir(parents=True)
    _paths.ensure_writable(f"{uc}/cache")
    # This session's catalog is Spark's session catalog, the Hive metastore on Databricks
    # (spark_catalog, or hive_metastore as a workspace default): no volume can be created
    # there, so no CREATE VOLUME is offered, only the catalog and schema to set.
    assert catalog in _paths.NO_VOLUME_CATALOGS
    for where in (volume, tmp_path / "Volumes" / "hive_metastore" / "default" / "hvdrunner"):
        with pytest.raises(ValueError, match="legacy Hive metastore, which has no volumes") as info:
            _paths.ensure_writable(f"{where}/cache")
        assert "CREATE VOLUME" not in str(info.value) and "USE SCHEMA <schema>" in str(info.value)
    assert default_experiment("hvdrunner-digits") == f"/Users/{user}/hvdrunner-digits"
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION")
    assert default_experiment("hvdrunner-digits") == "hvdrunner-digits"


def test_a_resume_key_is_a_job_run_id_not_a_filter_expression():
    from hvdrunner import tracking

    with pytest.raises(ValueError, match="resume_key="), tracking.mlflow_run(resume_key="1' OR '1"):
        pass


def _notebooks(*names: str, params: dict[str, str], tv: Path, cwd: Path,
               env: dict[str, str]) -> subprocess.Popen[str]:  # fmt: skip
    args = [sys.executable, "-m", "hvdrunner.notebook", "run",
            *[str(ROOT / "notebooks" / n) for n in names], "--task-values", str(tv)]  # fmt: skip
    for key, value in params.items():
        args += ["--param", f"{key}={value}"]
    return subprocess.Popen(args, cwd=cwd, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


@pytest.mark.torch
@pytest.mark.timeout(600)
def test_a_task_retry_continues_the_run_and_its_checkpoints(tmp_path, tracking_db):
    import mlflow

    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_db}
    tv = tmp_path / "task_values.json"
    # The kill comes at the first checkpoint, whichever it is: a wait for one named folder
    # (epoch-00002) missed it on a CI run (the notebook keeps its last 3, and digits epochs
    # are short), and the job then finished untouched.
    epochs = 16
    common = {"np": "2", "epochs": str(epochs), "cache_dir": str(tmp_path / "cache"),
              "experiment": "first-hour", "run_key": "808"}  # fmt: skip
    first = _notebooks("01_prepare_data.py", "02_train_torch.py", tv=tv, cwd=tmp_path, env=env,
                       params={**common, "output_dir": str(tmp_path / "data")})  # fmt: skip
    checkpoints = tmp_path / "checkpoints" / "808"  # beside cache_dir, as 02's widget table says

    def saved() -> list[int]:
        return sorted(int(p.name.split("-")[1]) for p in checkpoints.glob("epoch-*"))

    deadline = time.monotonic() + 400
    while not saved() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None and saved() and saved()[-1] < epochs, (  # still training
        saved(),
        first.poll(),
        first.stdout.read() if first.poll() is not None else "",
    )
    os.killpg(first.pid, signal.SIGKILL)  # the cluster went away mid-training
    first.wait(30)
    retry = _notebooks("02_train_torch.py", tv=tv, cwd=tmp_path, env=env, params=common)
    out, _ = retry.communicate(timeout=400)
    assert retry.returncode == 0, out[-4000:]
    assert "continuing MLflow run" in out and "resuming after epoch" in out
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    try:
        runs = mlflow.search_runs(experiment_names=["first-hour"], output_format="list")
        assert len(runs) == 1, [r.info.run_id for r in runs]  # one run for the job run
        run = runs[0]
        assert run.info.status == "FINISHED" and run.data.tags["hvdrunner.resume_key"] == "808"
        history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(epochs))  # every epoch once
    finally:
        mlflow.set_tracking_uri(None)
