"""The local notebook runner: parsing, magics, widgets, task values, errors naming the cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvdrunner._notebook_shim import LocalDbutils
from hvdrunner.notebook import NotebookError, parse, run_notebook, task_key

NB = """# Databricks notebook source
# MAGIC %md
# MAGIC # A title
# MAGIC text

# COMMAND ----------

# MAGIC %pip install -r ../requirements.txt

# COMMAND ----------

dbutils.widgets.text("n", "1")
value = int(dbutils.widgets.get("n")) * 10
dbutils.jobs.taskValues.set("value", value)

# COMMAND ----------

if value > 100:
    raise ValueError("too big")
dbutils.notebook.exit("done")
never_reached = True
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _namespace(params, values_file, key):
    return {
        "__name__": "__main__",
        "dbutils": LocalDbutils(params, str(values_file), key),
        "display": print,
    }


def test_parse_cells_and_magics(tmp_path):
    cells = parse(_write(tmp_path, "01_x.py", NB))
    assert [c.magic for c in cells] == ["md", "pip", None, None]
    assert cells[2].first_line == 13
    with pytest.raises(ValueError, match="not a Databricks source notebook"):
        parse(_write(tmp_path, "plain.py", "print(1)\n"))


def test_runs_skips_magics_and_exits(tmp_path, capsys):
    path = _write(tmp_path, "01_first.py", NB)
    ns = _namespace({"n": "3"}, tmp_path / "tv.json", task_key(path))
    assert run_notebook(str(path), ns) == "done"
    assert ns["value"] == 30 and "never_reached" not in ns
    out = capsys.readouterr().out
    assert "cell 1: A title" in out and "cell 2: skipped %pip" in out


def test_task_values_chain_between_notebooks(tmp_path):
    first = _write(tmp_path, "01_first.py", NB)
    second = _write(
        tmp_path,
        "02_second.py",
        '# Databricks notebook source\ngot = dbutils.jobs.taskValues.get("first", "value")\n',
    )
    run_notebook(str(first), _namespace({"n": "2"}, tmp_path / "tv.json", task_key(first)))
    ns = _namespace({}, tmp_path / "tv.json", task_key(second))
    run_notebook(str(second), ns)
    assert ns["got"] == 20


def test_error_names_notebook_cell_and_line(tmp_path):
    path = _write(tmp_path, "01_first.py", NB)
    with pytest.raises(
        NotebookError, match=r"01_first.py: cell 4 failed at line 20: ValueError: too big"
    ):
        run_notebook(str(path), _namespace({"n": "50"}, tmp_path / "tv.json", "first"))


def test_undefined_widget_and_missing_task_value(tmp_path):
    dbutils = LocalDbutils({}, str(tmp_path / "tv.json"), "t")
    with pytest.raises(KeyError, match="InputWidgetNotDefined"):
        dbutils.widgets.get("nope")
    with pytest.raises(ValueError, match="run that notebook first"):
        dbutils.jobs.taskValues.get("other", "key")
    assert dbutils.jobs.taskValues.get("other", "key", debugValue=5) == 5


def test_task_key_strips_order_prefix():
    assert task_key("notebooks/02_train_keras.py") == "train_keras"
