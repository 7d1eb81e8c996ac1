"""The local notebook runner: parsing, magics, widgets, task values, errors naming the cell."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hvdrunner.notebook import LocalDbutils, NotebookError, parse, run_notebook, task_key

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
    assert cells[2].first_line == 12  # the widgets.text line of NB
    with pytest.raises(ValueError, match="not a Databricks source notebook"):
        parse(_write(tmp_path, "plain.py", "print(1)\n"))


def test_runs_skips_magics_and_exits(tmp_path, capsys):
    path = _write(tmp_path, "01_first.py", NB)
    ns = _namespace({"n": "3"}, tmp_path / "tv.json", task_key(path))
    assert run_notebook(str(path), ns) == "done"
    assert ns["value"] == 30 and "never_reached" not in ns
    out = capsys.readouterr().err  # the runner speaks through the hvdrunner logger
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
        NotebookError, match=r"01_first.py: cell 4 failed at line 19: ValueError: too big"
    ):
        run_notebook(str(path), _namespace({"n": "50"}, tmp_path / "tv.json", "first"))


def test_undefined_widget_and_missing_task_value(tmp_path):
    dbutils = LocalDbutils({}, str(tmp_path / "tv.json"), "t")
    with pytest.raises(KeyError, match="InputWidgetNotDefined"):
        dbutils.widgets.get("nope")
    with pytest.raises(ValueError, match="run that notebook first"):
        dbutils.jobs.taskValues.get("other", "key")
    # In a job, as on Databricks, debugValue is ignored; default is what a missing key gives.
    with pytest.raises(ValueError, match="run that notebook first"):
        dbutils.jobs.taskValues.get("other", "key", debugValue=5)
    assert dbutils.jobs.taskValues.get("other", "key", default=4, debugValue=5) == 4


def test_by_hand_task_values_need_a_debug_value_as_on_databricks(tmp_path):
    (tmp_path / "tv.json").write_text('{"first": {"value": 20}}')
    dbutils = LocalDbutils({}, str(tmp_path / "tv.json"), "t", job=False)
    with pytest.raises(TypeError, match="Must pass debugValue when calling get outside of a job"):
        dbutils.jobs.taskValues.get("first", "value")
    assert dbutils.jobs.taskValues.get("first", "value", debugValue=7) == 7


def test_upstream_takes_the_widget_then_the_task_value_and_names_the_fix(tmp_path):
    from hvdrunner.notebook import upstream

    (tmp_path / "tv.json").write_text('{"prepare_data": {"train_path": "/data/train"}}')
    for job, params, expected in ((True, {}, "/data/train"), (True, {"train_path": "/x"}, "/x"),
                                  (False, {"train_path": "/x"}, "/x")):  # fmt: skip
        dbutils = LocalDbutils(params, str(tmp_path / "tv.json"), "train", job=job)
        dbutils.widgets.text("train_path", "")
        assert upstream(dbutils, "train_path", "prepare_data") == expected
    by_hand = LocalDbutils({}, str(tmp_path / "tv.json"), "train", job=False)
    by_hand.widgets.text("train_path", "")
    with pytest.raises(ValueError, match="set the 'train_path' widget"):
        upstream(by_hand, "train_path", "prepare_data")


def test_restart_python_ends_the_cell_and_clears_variables_but_not_widgets(tmp_path):
    path = _write(
        tmp_path,
        "01_restart.py",
        "# Databricks notebook source\ndbutils.widgets.text('n', '3')\nbefore = 1\n\n"
        "# COMMAND ----------\n\ndbutils.library.restartPython()\nnever = 1\n\n"
        "# COMMAND ----------\n\nafter = 'before' in dir()\nn = dbutils.widgets.get('n')\n",
    )
    ns = _namespace({}, tmp_path / "tv.json", "restart")
    run_notebook(str(path), ns)
    assert ns["after"] is False and "never" not in ns and "before" not in ns
    assert ns["n"] == "3" and "dbutils" in ns


def test_task_key_strips_order_prefix():
    assert task_key("notebooks/02_train_keras.py") == "train_keras"


def test_unknown_param_is_refused_before_anything_runs(tmp_path, capsys):
    from hvdrunner.notebook import run

    path = _write(tmp_path, "01_first.py", NB)
    code = run([str(path)], {"n": "2", "epochs": "3"}, str(tmp_path / "tv.json"), "local[1]")
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown parameter(s) ['epochs']" in err and "01_first.py: n" in err
    assert not (tmp_path / "tv.json").exists()  # nothing ran


def test_plain_python_file_is_refused_with_a_clear_message(tmp_path, capsys):
    from hvdrunner.notebook import run

    plain = _write(tmp_path, "script.py", "print('hi')\n")
    assert run([str(plain)], {}, str(tmp_path / "tv.json"), "local[1]") == 2
    err = capsys.readouterr().err
    assert "not a Databricks source notebook" in err and "Export" in err
    assert "Traceback" not in err


def test_syntax_error_names_notebook_cell_and_line(tmp_path):
    bad = NB.replace("value = int(", "value = int((")
    path = _write(tmp_path, "01_bad.py", bad)
    with pytest.raises(NotebookError, match=r"01_bad.py: cell 3 has a syntax error at line 13"):
        run_notebook(str(path), _namespace({"n": "1"}, tmp_path / "tv.json", "bad"))


def test_sys_exit_is_an_error_naming_dbutils_notebook_exit(tmp_path):
    path = _write(tmp_path, "01_exit.py", "# Databricks notebook source\nimport sys\nsys.exit(0)\n")
    with pytest.raises(NotebookError, match=r"sys.exit\(0\).*dbutils.notebook.exit"):
        run_notebook(str(path), _namespace({}, tmp_path / "tv.json", "exit"))


def test_notebook_exit_ends_that_notebook_and_the_chain_goes_on(tmp_path):

    first = _write(tmp_path, "01_first.py", NB)
    second = _write(
        tmp_path,
        "02_second.py",
        '# Databricks notebook source\ndbutils.jobs.taskValues.set("ran", True)\n',
    )
    values = tmp_path / "tv.json"
    # In a subprocess: the runner starts and stops its own Spark session.
    proc = _run_cli(first, second, "--param", "n=1", "--task-values", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    assert json.loads(values.read_text()) == {"first": {"value": 10}, "second": {"ran": True}}


def _run_cli(*args, env=None):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "hvdrunner.notebook", "run", *map(str, args), "--master", "local[1]"],
        capture_output=True, text=True, timeout=240, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_failed_notebook_ends_its_open_run_failed(tmp_path, store):
    import mlflow

    path = _write(
        tmp_path,
        "01_fail.py",
        "# Databricks notebook source\nimport mlflow\nrun = mlflow.start_run()\n"
        "dbutils.jobs.taskValues.set('run_id', run.info.run_id)\n"
        "# COMMAND ----------\nraise RuntimeError('boom')\n",
    )
    values = tmp_path / "tv.json"
    proc = _run_cli(
        path, "--task-values", str(values), env={"MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "cell 2 failed at line 6: RuntimeError: boom" in proc.stderr
    import json

    run_id = json.loads(values.read_text())["fail"]["run_id"]
    assert mlflow.get_run(run_id).info.status == "FAILED"


def test_shipped_notebooks_run_by_hand_refuse_missing_inputs_with_the_fix(
    tmp_path, capsys, monkeypatch
):
    # As opened by hand: no task values, widget defaults. Train needs its train_path; off
    # Databricks the folder defaults are local (./.hvdrunner/...), so 01 runs unchanged, and
    # a volume path given where no /Volumes mount exists is refused, naming it.
    from hvdrunner.notebook import run

    monkeypatch.chdir(tmp_path)
    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    code = run([str(notebooks / "02_train_keras.py")], {}, str(tmp_path / "tv.json"), "local[1]",
               job=False)  # fmt: skip
    assert code == 1
    assert "widget 'train_path' is empty" in capsys.readouterr().err
    code = run([str(notebooks / "01_prepare_data.py")], {}, str(tmp_path / "tv.json"), "local[1]",
               job=False)  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / ".hvdrunner" / "data").iterdir()) == ["test", "train"]
    if os.path.isdir("/Volumes"):
        return  # a machine with a /Volumes folder (macOS) accepts a volume path
    volume = "/Volumes/main/default/hvdrunner/data"
    code = run([str(notebooks / "01_prepare_data.py")], {"output_dir": volume},
               str(tmp_path / "tv.json"), "local[1]", job=False)  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert volume in err and "no /Volumes mount" in err


def test_run_leaves_a_spark_session_it_did_not_create_running(spark, tmp_path):
    from hvdrunner.notebook import run

    path = _write(
        tmp_path, "01_tiny.py", "# Databricks notebook source\nn = spark.range(3).count()\n"
    )
    assert run([str(path)], {}, str(tmp_path / "tv.json"), "local[1]") == 0
    assert spark.range(4).count() == 4  # the caller's session (here: the suite's) still works


def test_display_shows_a_dataframe_like_databricks_does(spark, tmp_path, capsys):
    path = _write(
        tmp_path, "01_show.py",
        "# Databricks notebook source\ndisplay(spark.range(3).toDF('n'))\ndisplay({'a': 1})\n",
    )  # fmt: skip
    from hvdrunner.notebook.shim import display

    ns = {"__name__": "__main__", "spark": spark, "display": display,
          "dbutils": LocalDbutils({}, str(tmp_path / "tv.json"), "show")}  # fmt: skip
    run_notebook(str(path), ns)
    out = capsys.readouterr().out
    assert "|  n|" in out and "|  2|" in out and "{'a': 1}" in out
