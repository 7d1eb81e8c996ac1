"""``python -m hvdrunner migrate``: HorovodRunner notebooks written as Databricks' published
examples are (tests/fixtures/notebooks: the Keras MNIST recipe in source format, a PyTorch
notebook with Horovod elastic and horovod.spark.run, a Petastorm notebook as .ipynb) are
rewritten where a drop-in exists, reported where a hand is needed, and left alone without
``--write``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdrunner.migrate import migrate_file, migrate_text

FIXTURES = Path(__file__).parent / "fixtures" / "notebooks"


@pytest.fixture()
def notebooks(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES, tmp_path / "nb")
    return tmp_path / "nb"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hvdrunner", "migrate", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_keras_recipe_gets_the_drop_ins_and_its_pip_line_is_reported(notebooks):
    path = notebooks / "keras_mnist_horovodrunner.py"
    before, report = migrate_file(str(path))
    assert "    import hvdrunner.hvd_keras as hvd\n" in report.text  # indentation kept
    assert "from hvdrunner import HorovodRunner\n" in report.text
    assert "horovod.tensorflow.keras" not in report.text and "sparkdl" not in report.text
    # Only those two lines changed; the rest of the notebook is byte for byte the same.
    changed = [
        a for a, b in zip(before.splitlines(), report.text.splitlines(), strict=True) if a != b
    ]
    assert changed == [
        "    import horovod.tensorflow.keras as hvd",
        "from sparkdl import HorovodRunner",
    ]
    [pip] = report.manual
    assert pip.text == "# MAGIC %pip install horovod==0.28.1" and "requirements.txt" in pip.fix


def test_elastic_and_horovod_spark_run_are_listed_with_their_fix(notebooks):
    _, report = migrate_file(str(notebooks / "torch_elastic_spark_run.py"))
    assert "from hvdrunner import log_to_driver\n" in report.text
    # horovod.torch becomes hvdrunner's engine (nothing compiled), its alias kept
    assert "import hvdrunner.hvd_torch as hvd" in report.text
    assert "import horovod.torch" not in report.text
    found = {f.what: f for f in report.manual}
    assert (
        "HorovodRunner(np=N).run(fn, **kwargs)"
        in found["horovod.spark.run(fn, args=..., num_proc=N)"].fix
    )
    assert "resumes from its last state.commit()" in found["Horovod elastic"].fix
    lines = report.text.splitlines()
    assert lines[found["Horovod elastic"].line - 1].strip() == found["Horovod elastic"].text


def test_an_ipynb_is_rewritten_cell_by_cell_and_stays_a_notebook(notebooks):
    path = notebooks / "petastorm_flowers.ipynb"
    _, report = migrate_file(str(path))
    nb = json.loads(report.text)
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert code[0].startswith(
        "from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter\n"
    )
    assert "    import hvdrunner.hvd_keras as hvd\n" in code[1]
    assert code[2].startswith("from hvdrunner import HorovodRunner\n")
    assert code[0].splitlines()[1] == "from hvdrunner.petastorm import TransformSpec"
    assert nb["cells"][0]["source"][0] == "# Petastorm + HorovodRunner: flowers\n"  # markdown kept
    assert report.manual == []  # everything this notebook uses has a drop-in


def test_a_dry_run_changes_nothing_and_write_applies_it_once(notebooks):
    before = {p.name: p.read_bytes() for p in notebooks.iterdir()}
    dry = _cli(str(notebooks))
    assert dry.returncode == 0, dry.stderr
    assert "+from hvdrunner import HorovodRunner" in dry.stdout
    assert "needs a hand: Horovod elastic" in dry.stdout
    assert "3 notebook(s); would rewrite (dry run; --write applies) 3;" in dry.stdout
    assert {p.name: p.read_bytes() for p in notebooks.iterdir()} == before
    wrote = _cli(str(notebooks), "--write")
    assert wrote.returncode == 0 and "rewrote 3;" in wrote.stdout
    assert (
        "from hvdrunner import HorovodRunner"
        in (notebooks / "keras_mnist_horovodrunner.py").read_text()
    )
    again = _cli(str(notebooks), "--write")  # idempotent: nothing left to rewrite
    assert "rewrote 0;" in again.stdout and "+from" not in again.stdout


def test_a_missing_path_is_refused_by_name(tmp_path):
    proc = _cli(str(tmp_path / "nope.py"))
    assert proc.returncode == 2 and "nope.py: no such file or folder" in proc.stderr


def test_names_sparkdl_never_had_are_left_to_python():
    # An import of something else from sparkdl is not guessed at: the line stays, Python
    # will say what is missing.
    report = migrate_text("from sparkdl import xgboost\n", "n.py")
    assert report.text == "from sparkdl import xgboost\n" and not report.rewritten
