"""``python -m hvdrunner migrate``: HorovodRunner notebooks written as Databricks' published
examples are (tests/fixtures/notebooks: the Keras MNIST recipe in source format, a PyTorch
notebook with Horovod elastic and horovod.spark.run, a Petastorm notebook as .ipynb) are
rewritten where a drop-in exists, reported where a hand is needed, and left alone without
``--write``."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import stat
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
    # ... and each petastorm call is named with its Mosaic Streaming equivalent beside it.
    hints = {(f.cell, f.what.split(" (")[0]): f for f in report.hints}
    assert set(hints) == {(2, "petastorm's make_spark_converter"),
                          (3, "petastorm's make_tf_dataset")}  # fmt: skip
    assert (
        "hvdrunner.streaming.write_mds(df, '/Volumes/"
        in hints[2, "petastorm's make_spark_converter"].fix
    )


def test_every_streaming_equivalent_migrate_names_exists():
    """The hints name real API: a rename in hvdrunner.streaming must change them too."""
    import re

    from hvdrunner.migrate import rules
    from hvdrunner.streaming import MdsData, write_mds

    named = set()
    for rule in rules.STREAMING:
        named |= set(re.findall(r"\bdata\.(\w+)\(", rule.fix))
        assert "hvdrunner.streaming.write_mds(" in rule.fix or "data." in rule.fix, rule.what
    assert named and all(callable(getattr(MdsData, n, None)) for n in named), named
    assert callable(write_mds)


def test_a_dry_run_changes_nothing_and_write_applies_it_once(notebooks):
    before = {p.name: p.read_bytes() for p in notebooks.iterdir()}
    dry = _cli(str(notebooks))
    assert dry.returncode == 0, dry.stderr
    assert "+from hvdrunner import HorovodRunner" in dry.stdout
    assert "needs a hand: Horovod elastic" in dry.stdout
    assert (
        "Mosaic Streaming instead (optional; the drop-in keeps working): petastorm's make_tf_dataset"
        in dry.stdout
    )
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
    # It is reported, with the line, as every import of sparkdl is.
    report = migrate_text("from sparkdl import xgboost\n", "n.py")
    assert report.text == "from sparkdl import xgboost\n" and not report.rewritten
    [finding] = report.manual
    assert finding.line == 1 and "sparkdl" in finding.what


# -- hostile input (issue 51): every way of writing an import or an install ----------------
EVERY_FORM_PY = """\
# Databricks notebook source
# MAGIC %pip install horovod==0.28.1 sparkdl

# COMMAND ----------

# MAGIC %sh
# MAGIC pip install --upgrade horovod

# COMMAND ----------

from sparkdl import HorovodRunner as HR
from sparkdl import HorovodRunner  # the launcher
from sparkdl import (
    HorovodRunner,
    log_to_driver,
)
from sparkdl.horovod import HorovodRunner
import sparkdl
import horovod.tensorflow.keras as hvd  # noqa
import horovod.tensorflow.keras as hvd; hvd.init()
import horovod.keras as hvd
import horovod.tensorflow.keras
from horovod.tensorflow.keras import DistributedOptimizer
import os, horovod.torch as hvd
import horovod.tensorflow as hvd_tf
from horovod.tensorflow import DistributedGradientTape
import horovod.spark
dbutils.library.installPyPI("horovod", version="0.28.1")

# COMMAND ----------

def train():
    import horovod.tensorflow.keras as hvd  # inside a function
    hvd.init()
"""
#: What each line becomes (rewritten), or None where it must be reported.
EXPECTED = {
    "from sparkdl import HorovodRunner as HR": "from hvdrunner import HorovodRunner as HR",
    "from sparkdl import HorovodRunner  # the launcher":
        "from hvdrunner import HorovodRunner  # the launcher",
    "from sparkdl import (": "from hvdrunner import (",
    "from sparkdl.horovod import HorovodRunner": "from hvdrunner import HorovodRunner",
    "import horovod.tensorflow.keras as hvd  # noqa": "import hvdrunner.hvd_keras as hvd  # noqa",
    "import horovod.tensorflow.keras as hvd; hvd.init()":
        "import hvdrunner.hvd_keras as hvd; hvd.init()",
    "import horovod.keras as hvd": "import hvdrunner.hvd_keras as hvd",
    "from horovod.tensorflow.keras import DistributedOptimizer":
        "from hvdrunner.hvd_keras import DistributedOptimizer",
    "import os, horovod.torch as hvd": "import os, hvdrunner.hvd_torch as hvd",
    "import horovod.tensorflow as hvd_tf": "import hvdrunner.hvd_tensorflow as hvd_tf",
    "from horovod.tensorflow import DistributedGradientTape":
        "from hvdrunner.hvd_tensorflow import DistributedGradientTape",
    "    import horovod.tensorflow.keras as hvd  # inside a function":
        "    import hvdrunner.hvd_keras as hvd  # inside a function",
}  # fmt: skip


def _unreported(text: str, reported_lines: set[int]) -> list[str]:
    """Lines still naming sparkdl or horovod that the report does not name."""
    return [f"{n}: {ln}" for n, ln in enumerate(text.splitlines(), start=1)
            if re.search(r"\b(?:sparkdl|horovod)\b", ln) and n not in reported_lines]  # fmt: skip


def test_every_form_of_import_and_install_is_rewritten_or_reported():
    report = migrate_text(EVERY_FORM_PY, "every_form.py")
    lines = report.text.splitlines()
    for old, new in EXPECTED.items():
        assert new in lines and old not in lines, (old, new)
    reported = {f.line: f for f in report.manual}
    assert not _unreported(report.text, set(reported)), _unreported(report.text, set(reported))
    by_text = {f.text: f for f in report.manual}
    assert "hvd_keras" in by_text["import horovod.tensorflow.keras"].fix
    assert "from hvdrunner import HorovodRunner" in by_text["import sparkdl"].fix
    assert (
        "installs horovod or sparkdl"
        in by_text["# MAGIC %pip install horovod==0.28.1 sparkdl"].what
    )
    assert "installs" in by_text["# MAGIC pip install --upgrade horovod"].what
    assert "installs" in by_text['dbutils.library.installPyPI("horovod", version="0.28.1")'].what
    assert len(report.manual) == 6, [f.text for f in report.manual]  # 3 installs, 3 imports
    assert lines[reported[min(reported)].line - 1].strip() == reported[min(reported)].text
    assert migrate_text(report.text, "again.py").rewritten == []  # idempotent


def test_the_same_forms_in_an_ipynb_are_numbered_by_cell_and_line(tmp_path):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# uses horovod\n"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": ["%pip install horovod\n", "!pip install sparkdl\n"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": ["%sh\n", "pip install horovod\n"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": ["import numpy as np\n", "import horovod.tensorflow.keras as hvd  # noqa\n",
                    "import sparkdl\n"]},
    ]  # fmt: skip
    nb = {"cells": cells, "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4,
          "nbformat_minor": 5}  # fmt: skip
    text = json.dumps(nb, indent=2, sort_keys=True) + "\n"  # not Jupyter's own layout
    path = tmp_path / "every_form.ipynb"
    path.write_text(text)
    before, report = migrate_file(str(path))
    where = sorted((f.cell, f.line) for f in report.manual)
    assert where == [(2, 1), (2, 2), (3, 2), (4, 3)], where  # as Jupyter shows them
    # The file keeps its layout: the only changed line is the rewritten import.
    changed = [ln for ln in difflib.unified_diff(before.splitlines(), report.text.splitlines(),
                                                 lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]  # fmt: skip
    assert changed == ['-        "import horovod.tensorflow.keras as hvd  # noqa\\n",',
                       '+        "import hvdrunner.hvd_keras as hvd  # noqa\\n",'], changed  # fmt: skip
    proc = _cli(str(path))
    assert f"{path}: cell 4, line 3: needs a hand" in proc.stdout, proc.stdout


def test_write_keeps_mode_writes_through_links_and_refuses_read_only_files(tmp_path):
    notebook = "from sparkdl import HorovodRunner\n"
    run = tmp_path / "run.py"
    run.write_text(notebook)
    run.chmod(0o750)
    owner = (1234, 1234) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(run, *owner)  # CI runs as root: another owner, which the rewrite must keep
    target = tmp_path / "real" / "linked.py"
    target.parent.mkdir()
    target.write_text(notebook)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    proc = _cli(str(run), str(link), "--write")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert stat.S_IMODE(run.stat().st_mode) == 0o750 and "hvdrunner" in run.read_text()
    assert (run.stat().st_uid, run.stat().st_gid) == owner
    assert link.is_symlink() and "hvdrunner" in target.read_text()
    # A read-only file is refused by name, and nothing else is written either.
    locked, other = tmp_path / "locked.py", tmp_path / "other.py"
    locked.write_text(notebook)
    locked.chmod(0o444)
    other.write_text(notebook)
    proc = _cli(str(other), str(locked), "--write")
    assert proc.returncode == 1 and f"{locked}: read-only" in proc.stderr, proc.stderr
    assert "nothing written" in proc.stderr and "Traceback" not in proc.stderr
    assert locked.read_text() == notebook and other.read_text() == notebook


def test_input_that_is_not_a_notebook_is_named_and_nothing_is_written(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    (folder / "a_good.py").write_text("from sparkdl import HorovodRunner\n")
    (folder / "b_binary.py").write_bytes(b"\x00\x01\x02horovod")
    (folder / "c_latin1.py").write_bytes(
        "# caf\xe9\nimport horovod.torch as hvd\n".encode("latin-1")
    )
    (folder / "d_broken.ipynb").write_text('{"cells": [{"cell_type": "code", "source": ["import')
    proc = _cli(str(folder), "--write")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{folder / 'b_binary.py'}: a binary file, not a notebook" in proc.stderr
    assert f"{folder / 'c_latin1.py'}: not UTF-8 text (byte 0xe9 at offset 5)" in proc.stderr
    assert f"{folder / 'd_broken.ipynb'}: not a valid .ipynb" in proc.stderr
    assert (folder / "a_good.py").read_text() == "from sparkdl import HorovodRunner\n"
    dry = _cli(str(folder))  # a dry run still shows what it can
    assert dry.returncode == 1 and "+from hvdrunner import HorovodRunner" in dry.stdout
