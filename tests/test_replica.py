"""The runtime replicas (docs/stacks.md, "The runtime replicas"): each installs what its
Databricks runtime ships, as requirements/<runtime>/runtime.txt records it from Databricks'
own list, with only the differences differences.txt gives a reason for; pyspark has no package
metadata, as on a cluster. The checks of the installed venv run on the replica's own stage."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import scripts

ROOT = Path(__file__).resolve().parents[1]


pins = scripts.load("runtime_pins")


def _replica() -> str:
    """The runtime this venv replicates (the Makefile's STACK), else skip: ``make test-all``
    on another stack has no runtime to compare with."""
    stack = os.environ.get("STACK", "")
    if not (ROOT / "requirements" / stack / "runtime.txt").exists():
        pytest.skip(f"STACK={stack!r} is no runtime replica")
    return stack


def _release(version: str) -> tuple[str, ...]:
    """A version as pip compares a pin: ``1.67`` is ``1.67.0``."""
    parts = version.split(".")
    while len(parts) > 1 and parts[-1] == "0":
        parts.pop()
    return tuple(parts)


def test_databricks_list_becomes_exact_pins_with_the_runtimes_spark(tmp_path):
    listed = tmp_path / "constraints.txt"
    listed.write_text("# constraints.txt file for Databricks Runtime 15.4.x-gpu-ml-scala2.12\n"
                      "Keras~=3.2.1\ntf_keras~=2.16.0\ntorch~=2.3.1\nspacy~=3.7.2\n")  # fmt: skip
    text = pins.runtime_txt("15.4", listed.read_text(), "a/constraints.txt at abc")
    written = pins.shipped(text)
    assert written["pyspark"] == "3.5.0"  # from the release notes: no pip package there
    assert (written["keras"], written["tf-keras"], written["torch"]) == ("3.2.1", "2.16.0", "2.3.1")
    assert "spacy" not in written  # not a package hvdrunner's paths touch
    assert "# tensorflow: not shipped" in text and "a/constraints.txt at abc" in text


def test_a_difference_replaces_the_runtimes_pin_and_needs_a_reason(tmp_path, monkeypatch):
    folder = tmp_path / "requirements" / "15.4"
    folder.mkdir(parents=True)
    (folder / "runtime.txt").write_text("pyspark==3.5.0  # spark\ntorch==2.3.1\nnumpy==1.23.5\n")
    (folder / "differences.txt").write_text("torch==2.3.0  # the only build for this Python\n")
    monkeypatch.setattr(pins, "ROOT", tmp_path)
    merged = pins.shipped(pins.constraints("15.4"))
    assert merged == {"pyspark": "3.5.0", "torch": "2.3.0", "numpy": "1.23.5"}
    (folder / "differences.txt").write_text("torch==2.3.0\n")
    with pytest.raises(SystemExit, match="torch differs from the runtime without a reason"):
        pins.constraints("15.4")


def test_every_replica_names_its_runtimes_python_in_runtime_txt():
    for folder in sorted((ROOT / "requirements").iterdir()):
        if (folder / "runtime.txt").exists():
            text = (folder / "runtime.txt").read_text()
            assert f"# python {pins.RUNTIMES[folder.name].python}\n" in text, folder
            assert "databricks/environments" in text.splitlines()[0], folder


@pytest.mark.torch  # every replica ships torch: these run on 19, which has no TensorFlow, too
@pytest.mark.stacks("15.4", "16.4", "17.3", "18", "19")
def test_the_replica_has_what_the_runtime_ships_and_no_more_differences():
    """Every package of the runtime's list that is installed here is at the runtime's version
    (or its recorded difference); the ones hvdrunner's paths need are installed."""
    stack = _replica()
    expected = pins.shipped(pins.constraints(stack))
    wrong = {}
    for name, version in expected.items():
        if name == "pyspark":
            continue
        try:
            found = md.version(name)
        except md.PackageNotFoundError:
            found = None
        if found is not None and _release(found) != _release(version):
            wrong[name] = found
    assert not wrong, f"installed, against {stack}'s pins {expected}: {wrong}"
    for needed in ("tensorflow", "keras", "torch", "numpy", "pandas", "pyarrow", "mlflow-skinny"):
        if needed in expected:  # 19 ships no TensorFlow and no Keras
            assert _release(md.version(needed)) == _release(expected[needed])


@pytest.mark.torch  # every replica ships torch: these run on 19, which has no TensorFlow, too
@pytest.mark.stacks("15.4", "16.4", "17.3", "18", "19")
def test_pyspark_is_importable_without_package_metadata_as_on_a_cluster():
    stack = _replica()
    with pytest.raises(md.PackageNotFoundError):
        md.version("pyspark")
    out = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__version__)"],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert out == pins.shipped(pins.constraints(stack))["pyspark"]
    from hvdrunner import _versions

    assert _versions.version("pyspark") == out  # what doctor reads, without metadata


@pytest.mark.parametrize(("version", "supported", "words"), [
    ("15.4", True, "CI runs a replica"),
    ("18.1", True, "CI runs a replica of its packages (STACK=18)"),
    ("19.0", True, "(STACK=19)"),
    ("16.4", True, "(STACK=16.4), its doctor and 2-rank Keras and PyTorch jobs"),
    ("17.3", True, "(STACK=17.3)"),
    ("20.1", None, "no replica of it runs in hvdrunner's CI yet"),
    ("14.3", False, "before 15.4 LTS"),
    ("client.1.13", None, "not a version hvdrunner can read"),
])  # fmt: skip
def test_the_doctor_names_the_runtime_and_whether_it_is_tested(version, supported, words):
    from hvdrunner import workspace

    found, line = workspace.runtime_support({"DATABRICKS_RUNTIME_VERSION": version})
    assert found is supported and words in line and version in line
    assert workspace.runtime_support({}) == (None, "not databricks")


def test_the_runtimes_said_to_be_replicated_are_the_replicas_ci_builds():
    from hvdrunner import workspace

    built = {f.name for f in (ROOT / "requirements").iterdir() if (f / "framework.txt").exists()
             and (f / "runtime.txt").exists()}  # fmt: skip
    said = {k for k, v in workspace.TESTED_RUNTIMES.items() if "replica" in v}
    assert said == built
    # CI sets up and tests every replica (and gpu) in each of its schedules (.ci/run's
    # WAVES: all at once, three at a time, or one, by the room on the disk).
    ci = (ROOT / ".ci" / "run").read_text()
    schedules = re.findall(r"^\s*WAVES=\((.*)\)$", ci, re.M)
    assert len(schedules) == 3, schedules
    for waves in schedules:
        stacks = waves.replace('"', " ").split()
        assert sorted(stacks) == sorted(built | {"gpu"}), waves
    assert 'make test STACK="$1"' in ci and 'make env STACK="$s"' in ci


matrix = scripts.load("support_matrix")
KERAS_FIT = "tests/test_keras_fit.py::test_two_rank_fit_reaches_accuracy_and_mlflow_agrees"


def test_a_stage_records_its_outcomes_and_the_matrix_reads_them(tmp_path):
    """A real `make test`-style stage writes its results file (tests/conftest.py); record()
    makes a cell of each path from the stages of its runtime, by the stage's Keras backend."""
    env = {**os.environ, "STACK": "18", "HVDRUNNER_RESULTS_DIR": str(tmp_path)}
    test = "tests/test_replica.py::test_every_replica_names_its_runtimes_python_in_runtime_txt"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)  # fmt: skip
    written = json.loads((tmp_path / "18.json").read_text())
    assert written["stack"] == "18" and written["outcomes"] == {test: "passed"}

    def stage(stack, backend, outcomes):
        return {"stack": stack, "keras_backend": backend, "outcomes": outcomes}

    assert tuple(pins.RUNTIMES) == matrix.RUNTIMES  # the matrix's rows: the replicated runtimes
    for runtime in matrix.RUNTIMES:
        backend = "torch" if runtime == "19" else "tensorflow"
        outcome = "failed" if runtime == "17.3" else "passed"
        (tmp_path / f"{runtime}.json").write_text(json.dumps(stage(runtime, backend, {
            KERAS_FIT + "[x]": outcome, "tests/test_connect.py::test_a": "skipped"})))  # fmt: skip
    cells = matrix.record(tmp_path, "abc")["cells"]
    assert cells["18"]["Keras on TensorFlow"] == "pass" and cells["18"]["Keras on PyTorch"] == ""
    assert cells["19"]["Keras on PyTorch"] == "pass" and cells["19"]["Keras on TensorFlow"] == ""
    assert cells["17.3"]["Keras on TensorFlow"] == "FAIL"
    assert cells["18"]["Spark Connect"] == ""  # skipped is not run
    (tmp_path / "16.4.json").unlink()
    with pytest.raises(SystemExit, match=r"no results of the replicas \['16.4'\]"):
        matrix.record(tmp_path, "abc")


def test_the_support_matrix_the_docs_show_is_the_one_recorded_from_a_run():
    recorded = json.loads(matrix.RECORD.read_text())
    assert set(recorded["cells"]) == set(matrix.RUNTIMES)
    table = matrix.render(recorded)
    assert "not run" not in table, f"a gap without a reason (support_matrix.REASONS):\n{table}"
    assert "✗" not in table, f"a path failed in the recorded run:\n{table}"
    rows = table.split("\n\n")[0]
    for doc in ("README.md", "docs/stacks.md"):
        assert rows in (ROOT / doc).read_text(), f"{doc}: not the recorded matrix:\n{table}"
