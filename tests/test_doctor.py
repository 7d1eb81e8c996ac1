"""hvdrunner doctor: real run against this environment, and the verdict on broken builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hvdrunner
from hvdrunner.doctor import evaluate_build, evaluate_stack

GOOD_BUILD = {
    "horovod": "0.28.1",
    "tensorflow": "2.15.1",
    "torch": None,
    "tensorflow_ext": True,
    "torch_ext": False,
    "gloo": True,
    "mpi": False,
    "nccl": False,
}
GOOD_STACK = {
    "tensorflow": "2.15.1",
    "keras": "2.15.0",
    "numpy": "1.26.4",
    "pyarrow": "14.0.2",
    "petastorm": "0.13.1",
    "pyspark": "3.5.9",
    "mlflow": "3.17.2",
}
GOOD_MODERN = {
    "tensorflow": "2.21.0",
    "keras": "3.15.1",
    "tf_keras": "2.21.0",
    "numpy": "2.5.5",
    "pyarrow": "25.0.1",
    "petastorm": None,
    "pyspark": "4.0.5",
    "mlflow": "3.17.2",
}


def _failed(checks):
    return [c for c in checks if c.ok is False and c.required]


@pytest.fixture(scope="module")
def doctor_here() -> subprocess.CompletedProcess[str]:
    """One real `hvdrunner doctor` run in this environment (about 14 s: it loads each
    framework and horovod's extensions in subprocesses), for the tests that read it."""
    return subprocess.run(
        [sys.executable, "-m", "hvdrunner", "doctor"], capture_output=True, text=True, timeout=300
    )


@pytest.mark.stacks("15.4", "18")  # the doctor checks the installed stack
def test_doctor_passes_on_this_environment(doctor_here):
    proc = doctor_here
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[x] horovod built with TensorFlow: yes" in proc.stdout
    assert "[x] horovod built with gloo: yes" in proc.stdout
    # The banner of `horovodrun --check-build` claims PyTorch; the doctor must not.
    assert "[-] horovod built with PyTorch: no" in proc.stdout


def test_good_build_and_both_stacks_pass():
    assert not _failed(evaluate_build(GOOD_BUILD))
    assert not _failed(evaluate_stack(GOOD_STACK, env={}))
    modern = evaluate_stack(GOOD_MODERN, env={})
    assert not _failed(modern)
    keras = next(c for c in modern if c.name == "Keras generation")
    assert "Keras 3" in keras.detail and "hvdrunner.hvd_keras" in keras.detail
    legacy = evaluate_stack(GOOD_MODERN, env={"TF_USE_LEGACY_KERAS": "1"})
    assert not _failed(legacy)
    assert "tf_keras mode" in next(c for c in legacy if c.name == "Keras generation").detail


def test_keras_mixes_on_modern_fail_with_fix():
    no_tf_keras = GOOD_MODERN | {"tf_keras": None}
    failed = _failed(evaluate_stack(no_tf_keras, env={"TF_USE_LEGACY_KERAS": "1"}))
    assert [c.name for c in failed] == ["Keras generation"]
    assert "pip install tf_keras==2.21" in failed[0].fix
    wrong_tf_keras = GOOD_MODERN | {"tf_keras": "2.15.1"}
    assert _failed(evaluate_stack(wrong_tf_keras, env={"TF_USE_LEGACY_KERAS": "true"}))
    failed = _failed(evaluate_stack(GOOD_MODERN, env={"KERAS_BACKEND": "jax"}))
    assert [c.name for c in failed] == ["Keras generation"] and "KERAS_BACKEND" in failed[0].fix
    broken_petastorm = GOOD_MODERN | {"petastorm": "0.13.1"}
    assert [c.name for c in _failed(evaluate_stack(broken_petastorm, env={}))] == [
        "petastorm 0.13.1 with pyarrow < 15"
    ]


def test_horovod_without_tensorflow_fails_with_fix():
    failed = _failed(evaluate_build(GOOD_BUILD | {"tensorflow_ext": False}))
    assert [c.name for c in failed] == ["horovod built with TensorFlow"]
    assert "scripts/install_horovod.sh" in failed[0].fix and "patches/" in failed[0].fix


GOOD_TORCH_BUILD = GOOD_BUILD | {"tensorflow": None, "tensorflow_ext": False,
                                 "torch": "2.13.0+cpu", "torch_ext": True}  # fmt: skip
GOOD_TORCH_STACK = {"tensorflow": None, "torch": "2.13.0+cpu", "numpy": "2.4.6",
                    "pyarrow": "22.0.0", "pyspark": "4.1.1", "mlflow": "3.8.1"}  # fmt: skip


def test_the_torch_stack_needs_no_tensorflow_and_horovods_torch_extension_only_to_use_it():
    # TensorFlow absent is information on 19; horovod's torch extension is not.
    assert not _failed(evaluate_build(GOOD_TORCH_BUILD))
    assert not _failed(evaluate_stack(GOOD_TORCH_STACK, env={}))
    # horovod's torch extension is required only where PyTorch is to run on it
    compiled = {"HVDRUNNER_TORCH_ENGINE": "horovod"}
    failed = _failed(evaluate_build(GOOD_TORCH_BUILD | {"torch_ext": False}, env=compiled))
    assert [c.name for c in failed] == ["horovod built with PyTorch"]
    assert "torch 2.13.0+cpu" in failed[0].detail and "torch >= 2.1" in failed[0].fix
    engine = evaluate_build(GOOD_TORCH_BUILD | {"torch_ext": False}, env={})
    assert not _failed(engine)
    assert "hvdrunner.hvd_torch" in next(c for c in engine if "PyTorch" in c.name).detail
    # no horovod at all: fine for PyTorch and TensorFlow on the engine (torch installed),
    # not where the compiled one is asked for, nor for TensorFlow without torch
    bare = {"horovod": None, "tensorflow": None, "torch": "2.13.0+cpu"}
    assert not _failed(evaluate_build(bare, env={}))
    assert _failed(evaluate_build(bare, env=compiled))
    assert not _failed(evaluate_build(bare | {"tensorflow": "2.21.0"}, env={}))
    assert _failed(
        evaluate_build(bare | {"tensorflow": "2.21.0"}, env={"HVDRUNNER_ENGINE": "horovod"})
    )
    assert _failed(evaluate_build(bare | {"tensorflow": "2.15.1", "torch": None}, env={}))
    # TF installed beside torch: the TensorFlow extension only where asked for.
    both = GOOD_TORCH_BUILD | {"tensorflow": "2.21.0"}
    assert not _failed(evaluate_build(both))
    asked = _failed(evaluate_build(both, env={"HVDRUNNER_ENGINE": "horovod"}))
    assert [c.name for c in asked] == ["horovod built with TensorFlow"]
    # Neither framework: the stack fails naming TensorFlow (and 19).
    none = _failed(evaluate_stack(GOOD_TORCH_STACK | {"torch": None}, env={}))
    assert [c.name for c in none] == ["tensorflow"] and "STACK=19" in none[0].fix


def test_keras_3_without_tensorflow_needs_the_torch_backend():
    keras_on_torch = GOOD_TORCH_STACK | {"keras": "3.15.1"}
    good = evaluate_stack(keras_on_torch, env={"KERAS_BACKEND": "torch"})
    assert not _failed(good)
    assert "backend torch" in next(c for c in good if c.name == "Keras generation").detail
    # A PyTorch user's environment with Keras beside it passes: the setting is advice.
    advice = evaluate_stack(keras_on_torch, env={})
    assert not _failed(advice)
    (keras,) = [c for c in advice if c.name == "Keras generation"]
    assert keras.ok is None and not keras.required and "KERAS_BACKEND=torch" in keras.detail
    # A backend named that is not installed fails (Keras' default, tensorflow, is absent).
    for env in ({"KERAS_BACKEND": "jax"}, {"KERAS_BACKEND": "tensorflow"}):
        failed = _failed(evaluate_stack(keras_on_torch, env=env))
        assert [c.name for c in failed] == ["Keras generation"]
        assert "KERAS_BACKEND=torch" in failed[0].fix
    # Beside TensorFlow, PyTorch is a backend too.
    assert not _failed(
        evaluate_stack(GOOD_MODERN | {"torch": "2.13.0"}, env={"KERAS_BACKEND": "torch"})
    )


def test_horovod_without_gloo_or_missing_fails():
    assert [c.name for c in _failed(evaluate_build(GOOD_BUILD | {"gloo": False}))] == [
        "horovod built with gloo"
    ]
    assert [c.name for c in _failed(evaluate_build({"horovod": None}))] == ["horovod"]


def test_incompatible_stack_versions_fail():
    names = {
        c.name
        for c in _failed(
            evaluate_stack(
                GOOD_STACK | {"pyarrow": "15.0.2", "keras": "3.3.3", "numpy": "2.1.0"}, env={}
            )
        )
    }
    assert names == {
        "petastorm 0.13.1 with pyarrow < 15",
        "Keras generation",
        "numpy < 2 (TF <= 2.15)",
    }


def test_doctor_fails_loudly_where_the_stack_is_missing(tmp_path):
    # A real interpreter with none of the stack: a bare venv that sees only hvdrunner's source.
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    src = str(Path(hvdrunner.__file__).resolve().parents[1])
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "hvdrunner", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": src, "PATH": os.environ["PATH"]},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[ ] horovod: not installed" in proc.stdout
    assert "fix: rebuild horovod" in proc.stdout
    assert "required check(s) failed" in proc.stdout


def test_doctor_reports_this_hosts_multihost_readiness(doctor_here):
    proc = doctor_here
    # the horovod of this stack is hvdrunner's build: patched, whatever the hostname does
    assert "[x] multi-host gloo (hostname, horovod's gloo interface patch):" in proc.stdout
    assert "horovod patched" in proc.stdout


def test_multihost_check_fails_only_for_loopback_name_with_unpatched_horovod():
    from hvdrunner.doctor import multihost_check
    from hvdrunner.multihost import HostFacts

    broken = multihost_check(HostFacts("node7", "127.0.1.1", False, "0.28.1"))
    assert broken.ok is False and not broken.required  # single-host jobs still work
    assert "Host node7" in broken.detail and "127.0.1.1" in broken.detail
    assert multihost_check(HostFacts("node7", "127.0.1.1", True, "0.28.1")).ok is True
    assert multihost_check(HostFacts("node7", "10.0.0.7", False, "0.28.1")).ok is True
    assert multihost_check(HostFacts("node7", None, None, None)).ok is None


def _cluster_like_site(tmp_path: Path) -> Path:
    """This interpreter's site-packages as a Databricks cluster lays it out: pyspark
    importable without package metadata (a cluster puts /databricks/spark/python on the path),
    MLflow installed as ``mlflow-skinny`` (the only MLflow of ML runtimes since 15.4)."""
    import mlflow

    real = Path(mlflow.__file__).resolve().parents[1]
    site = tmp_path / "site-packages"
    site.mkdir()
    for entry in real.iterdir():
        name = entry.name.lower()
        if not (
            name.startswith(("pyspark-", "mlflow-", "mlflow_")) and name.endswith(".dist-info")
        ):
            (site / entry.name).symlink_to(entry)
    skinny = site / f"mlflow_skinny-{mlflow.__version__}.dist-info"
    skinny.mkdir()
    (skinny / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: mlflow-skinny\nVersion: {mlflow.__version__}\n"
    )
    return site


def test_a_clusters_pyspark_without_metadata_and_its_mlflow_skinny_pass_the_doctor(tmp_path):
    import json

    import mlflow
    import pyspark

    site = _cluster_like_site(tmp_path)
    src = str(Path(hvdrunner.__file__).resolve().parents[1])
    script = f"""
import importlib.metadata as md, json, site, sys
site.addsitedir({str(site)!r})
sys.path.insert(0, {src!r})
from hvdrunner.doctor import evaluate_stack, installed_versions
def meta(d):
    try:
        return md.version(d)
    except md.PackageNotFoundError:
        return None
versions = installed_versions()
checks = {{c.name: c.ok for c in evaluate_stack(versions)}}
print(json.dumps({{"meta": [meta("pyspark"), meta("mlflow")], "versions": versions,
                  "checks": checks}}))
"""
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["meta"] == [None, None]  # as on a cluster: no metadata under these names
    assert out["versions"]["pyspark"] == pyspark.__version__
    assert out["versions"]["mlflow"] == mlflow.__version__
    assert out["checks"]["pyspark"] is True and out["checks"]["mlflow"] is True


def test_an_extension_that_crashes_its_interpreter_is_reported_not_loaded(tmp_path, monkeypatch):
    # A horovod library built against another framework can abort the interpreter that
    # loads it: the doctor loads each in one of its own, and reads the flags where it loaded.
    (tmp_path / "aborts_on_import.py").write_text("import os\nos.abort()\n")
    (tmp_path / "loads_fine.py").write_text(
        "gloo_built = lambda: 1\nmpi_built = lambda: 0\nnccl_built = lambda: False\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    from hvdrunner.doctor import build

    assert build._probe("aborts_on_import") is None
    assert build._probe("loads_fine") == {"gloo_built": True, "mpi_built": False,
                                          "nccl_built": False}  # fmt: skip
