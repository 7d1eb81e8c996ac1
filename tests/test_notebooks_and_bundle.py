"""The shipped notebooks and the bundle's jobs: format, widgets vs job parameters, and the
three notebooks executed end to end as a local job (real Spark, Horovod, MLflow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml

from hvdrunner.notebook import parse, task_key

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


def _widgets(path: Path) -> set[str]:
    return set(
        re.findall(r'dbutils\.widgets\.(?:text|dropdown|combobox)\(\s*"(\w+)"', path.read_text())
    )


def _jobs() -> dict:
    jobs = {}
    for path in sorted((ROOT / "resources").glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        for name, job in doc.get("resources", {}).get("jobs", {}).items():
            jobs[name] = (path, job)
    return jobs


def test_there_are_five_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "01_prepare_data.py",
        "02_train_keras.py",
        "02_train_torch.py",
        "03_batch_inference.py",
        "04_images.py",
    ]


@pytest.mark.keras
@pytest.mark.stacks("18")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("feed", ["prepare", "streaming"])
def test_the_image_notebook_runs_end_to_end_on_generated_images(tmp_path, tracking_db, feed):
    """04_images as the local runner runs it: JPEG files -> binaryFile table -> prepare (or
    Mosaic Streaming's MDS shards) -> decoded on 2 ranks -> a CNN logged to MLflow -> the
    held-out images scored."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_db}
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrunner.notebook", "run", str(ROOT / "notebooks" / "04_images.py"),
         "--task-values", str(tmp_path / "tv.json"), "--param", "epochs=4", "--param",
         f"feed={feed}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    values = json.loads((tmp_path / "tv.json").read_text())["images"]
    assert values["test_accuracy"] > 0.9
    assert (tmp_path / ".hvdrunner" / "flowers" / "tulips").is_dir()  # generated images
    kept = "*.parquet" if feed == "prepare" else "*.mds.zstd"  # not Streaming's raw copies
    cache = tmp_path / ".hvdrunner" / "cache"
    cached = sum(p.stat().st_size for p in cache.rglob(kept))
    assert (cache / "images-mds" / "index.json").exists() == (feed == "streaming")
    jpegs = sum(p.stat().st_size for p in (tmp_path / ".hvdrunner" / "flowers").rglob("*.jpg"))
    assert 0 < cached < 1.2 * jpegs  # the bytes are kept as they are, never decoded pixels
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    try:
        run = mlflow.get_run(values["run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.metrics["test_accuracy"] == pytest.approx(values["test_accuracy"])
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_format(path):
    cells = parse(path)
    assert cells[0].magic == "md", "first cell must be markdown saying what the notebook does"
    assert "widget" in cells[0].source  # documents its parameters
    # No %pip of a file beside the notebook (one imported by hand has none): the jobs attach
    # the wheels as task libraries; the first code cell says how to install them otherwise.
    assert not [c for c in cells if c.magic == "pip"]
    first = next(c for c in cells if c.magic is None)
    assert "import hvdrunner" in first.source and "docs/install.md" in first.source
    assert "taskValues.get(" not in path.read_text()  # upstream() passes the debugValue
    source = path.read_text()
    for needle in ("model.fit(", "for epoch", "hvd.init(", ".write.parquet("):
        assert needle not in source, (
            f"{path.name}: {needle!r} belongs in src/hvdrunner, not a notebook"
        )
    for widget in _widgets(path):
        assert f"`{widget}`" in cells[0].source, f"{path.name}: widget {widget!r} is not documented"


@pytest.mark.parametrize(
    "name,framework", [("hvdrunner_train", "keras"), ("hvdrunner_train_torch", "torch")]
)
def test_jobs_load_with_databricks_bundles_and_match_the_notebooks(name, framework):
    from databricks.bundles.jobs import Job

    jobs = _jobs()
    assert sorted(jobs) == ["hvdrunner_build_horovod", "hvdrunner_train", "hvdrunner_train_torch"]
    Job.from_dict(jobs["hvdrunner_build_horovod"][1])
    path, raw = jobs[name]
    job = Job.from_dict(raw)
    assert job.name == "${bundle.target}-" + name.replace("_", "-")
    keys = [t.task_key for t in job.tasks]
    assert keys == ["prepare_data", f"train_{framework}", "batch_inference"]
    # 03 scores the model of the training task its `train_task` names (default train_keras).
    scoring = job.tasks[2].notebook_task.base_parameters.get("train_task", "train_keras")
    assert scoring == f"train_{framework}"
    assert job.tasks[2].depends_on[0].task_key == f"train_{framework}"
    for task in job.tasks:
        notebook = (path.parent / task.notebook_task.notebook_path).resolve()
        assert notebook.is_file(), f"{task.task_key}: {notebook} does not exist"
        assert task_key(notebook) == task.task_key  # task values chain by these keys
        unknown = set(task.notebook_task.base_parameters) - _widgets(notebook)
        assert not unknown, f"{task.task_key}: base parameters without a widget: {unknown}"
        assert task.job_cluster_key == "gpu_cluster"
        assert "../dist/hvdrunner-*.whl" in [lib.whl for lib in task.libraries]
    cluster = raw["job_clusters"][0]["new_cluster"]
    assert cluster["spark_conf"]["spark.task.resource.gpu.amount"] == "1"
    # Unity Catalog era: dedicated access mode (barrier RDD jobs), storage on a volume.
    assert cluster["data_security_mode"] == "SINGLE_USER"
    # Targets, paths and the horovod wheel: tests/test_bundle.py.


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "framework,feed,backend",
    [
        # Each Keras generation once: lts with the Petastorm-style feed (02's feed widget),
        # modern with prepare() (`make demo`). The PyTorch job and Keras 3 on PyTorch run as
        # the bundle's jobs in tests/test_workspace.py (19).
        pytest.param("keras", "prepare", None,
                     marks=[pytest.mark.keras, pytest.mark.stacks("18")]),
        pytest.param("keras", "petastorm", None,
                     marks=[pytest.mark.keras, pytest.mark.stacks("15.4")]),
    ],
)  # fmt: skip
def test_the_three_notebooks_run_as_a_local_job(tmp_path, framework, feed, backend):
    # No tracking URI set: the demo's own default store, ./mlflow.db, on every stack (MLflow
    # 2.13 alone would default to a file store in ./mlruns).
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrunner", "demo", "--notebooks", str(ROOT / "notebooks"),
         "--epochs", "4", "--workdir", str(tmp_path / "demo"), "--framework", framework,
         *(["--param", f"feed={feed}"] if feed else []),
         *(["--param", f"keras_backend={backend}"] if backend else [])],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    values = json.loads((tmp_path / "demo" / "task_values.json").read_text())
    assert set(values) == {"prepare_data", f"train_{framework}", "batch_inference"}
    accuracy = values["batch_inference"]["test_accuracy"]
    assert accuracy > 0.8  # 4 epochs on digits; the 10-epoch demo reaches ~0.96
    assert f"test accuracy: {accuracy:.3f}" in proc.stdout
    # Progress and the result only: nothing a newcomer would read as an error.
    said = proc.stdout + proc.stderr
    noise = ["cudart_stub", "absl::InitializeLog", "cuInit", "alembic", "env_manager",
             "Using incubator modules",
             "WARN Utils", "NativeCodeLoader", "log4j", "━", "ETA:", "<stderr>",
             "Setuptools is replacing distutils", "No training configuration"]  # fmt: skip
    assert not [n for n in noise if n in said], [
        line for line in said.splitlines() if any(n in line for n in noise)
    ][:10]
    if feed is not None:  # which feed wrote the training files: the converter's uncompressed
        import pyarrow.parquet as pq

        codecs = {pq.ParquetFile(p).metadata.row_group(0).column(0).compression
                  for p in (tmp_path / "demo" / "cache").rglob("*.parquet")}  # fmt: skip
        assert codecs == ({"UNCOMPRESSED"} if feed == "petastorm" else {"SNAPPY"}), codecs
    assert (tmp_path / "mlflow.db").is_file()  # the runs, params and metrics live there
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db" in proc.stdout
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        run = mlflow.get_run(values[f"train_{framework}"]["run_id"])
        assert run.info.status == "FINISHED"
        if backend:
            assert run.data.params["keras_backend"] == backend
        assert run.data.metrics["test_accuracy"] == pytest.approx(accuracy)
        assert (tmp_path / "demo" / "predictions").is_dir()
    finally:
        mlflow.set_tracking_uri(None)
