"""Run Databricks source-format notebooks locally: ``python -m hvdrunner.notebook run …``.

    python -m hvdrunner.notebook run notebooks/01_prepare_data.py notebooks/02_train_keras.py \\
        --param epochs=2 --param np=2

Cells (split at ``# COMMAND ----------``) run in order in one namespace holding ``spark``
(local Spark), ``dbutils`` (widgets, task values, ``notebook.exit``) and ``display``.
Markdown cells are shown as a heading; ``%pip`` and other magics are skipped with a note.
Several notebooks in one command share the Spark session and their task values, like the
tasks of one job; ``--interactive`` runs them as notebooks opened by hand instead
(``taskValues.get`` then needs a ``debugValue``, as on Databricks).
``dbutils.library.restartPython()`` clears the notebook's variables, as on Databricks.
An error names the notebook, the cell number and the line.

As on Databricks: ``dbutils.notebook.exit(value)`` ends that notebook successfully and the
chain goes on. Unlike a local script, ``sys.exit()`` in a cell is an error here (on
Databricks it does not end a notebook cleanly): use ``dbutils.notebook.exit``. A ``--param``
that no notebook defines as a widget is refused before anything runs (a typo would
otherwise train silently with the default). A failing notebook ends the MLflow run it left
open FAILED.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdrunner._console import say
from hvdrunner._logging import get_logger
from hvdrunner.errors import NotebookError
from hvdrunner.notebook.shim import LocalDbutils, NotebookExit, PythonRestart, display

HEADER = "# Databricks notebook source"
SEPARATOR = re.compile(r"^# COMMAND -{10,}[ \t]*$", re.MULTILINE)
_WIDGET = re.compile(
    r"dbutils\.widgets\.(?:text|dropdown|combobox|multiselect)\(\s*(?:name\s*=\s*)?['\"]([^'\"]+)['\"]"
)


@dataclass(frozen=True)
class Cell:
    number: int  # 1-based, as Databricks shows them
    source: str
    first_line: int  # line of the file where the cell starts

    @property
    def magic(self) -> str | None:
        """``md``, ``pip``, ``sh``… when every code line is ``# MAGIC``; else ``None``."""
        lines = [line for line in self.source.splitlines() if line.strip()]
        if lines and all(line.startswith("# MAGIC") for line in lines):
            m = re.match(r"# MAGIC\s*%(\w+)", lines[0])
            return m.group(1) if m else "md"
        return None


def parse(path: str | os.PathLike[str]) -> list[Cell]:
    """Split a source-format notebook into cells.

    Raises:
        ValueError: the file does not start with the Databricks source header.
    """
    text = Path(path).read_text()
    if not text.startswith(HEADER):
        raise ValueError(
            f"{path}: not a Databricks source notebook (its first line must be {HEADER!r}). "
            f"Export the notebook as source (File > Export > Source file), or run a plain "
            f"script with python directly."
        )
    body = text[len(HEADER) :]
    # The body starts on line 1, right after the header; each separator sits on the line
    # where the previous chunk's last newline leads, and the next chunk starts on it.
    cells, line = [], 1
    for n, chunk in enumerate(SEPARATOR.split(body), start=1):
        cells.append(Cell(n, chunk.strip("\n"), line + len(chunk) - len(chunk.lstrip("\n"))))
        line += chunk.count("\n")
    return cells


def widgets(path: str | os.PathLike[str]) -> list[str]:
    """The widget names a notebook defines (``dbutils.widgets.text("name", ...)`` etc.)."""
    return sorted(set(_WIDGET.findall(Path(path).read_text())))


def _markdown_title(source: str) -> str:
    """The first non-empty text line of a ``# MAGIC %md`` cell, without markup."""
    for line in source.splitlines():
        text = line.removeprefix("# MAGIC").strip().removeprefix("%md").strip().lstrip("#").strip()
        if text:
            return text
    return ""


def task_key(path: str | os.PathLike[str]) -> str:
    """``notebooks/02_train_keras.py`` → ``train_keras`` (the job's task key)."""
    return re.sub(r"^\d+_", "", Path(path).stem)


_log = get_logger("hvdrunner.notebook")


def run_notebook(path: str, namespace: dict[str, Any]) -> str | None:
    """Run one notebook's cells in ``namespace``; returns its ``dbutils.notebook.exit`` value.

    ``dbutils.library.restartPython()`` ends its cell and leaves only the Databricks globals
    (``spark``, ``sc``, ``dbutils``, ``display``) in ``namespace``, as a restart does.
    """
    cells = parse(path)
    initial = dict(namespace)
    name = Path(path).name
    _log.info(f"{name}: {len(cells)} cells")
    for cell in cells:
        magic = cell.magic
        if magic == "md":
            title = _markdown_title(cell.source)
            _log.info(f"{name} cell {cell.number}: {title}".rstrip(": "))
            continue
        if magic is not None:
            _log.info(
                f"{name} cell {cell.number}: skipped %{magic} (not run locally; the local environment is already installed)"
            )
            continue
        # Pad with newlines so tracebacks carry the file's own line numbers.
        try:
            code = compile(
                "\n" * (cell.first_line - 1) + cell.source, f"{path} [cell {cell.number}]", "exec"
            )
        except SyntaxError as exc:
            raise NotebookError(
                f"{name}: cell {cell.number} has a syntax error at line {exc.lineno}: {exc.msg}"
                f"{': ' + exc.text.strip() if exc.text else ''}"
            ) from exc
        try:
            exec(code, namespace)  # noqa: S102 - running the user's notebook is the point
        except NotebookExit as done:
            _log.info(f"{name}: exited with {done.value!r}")
            return done.value
        except PythonRestart:
            _log.info(f"{name} cell {cell.number}: Python restarted (notebook variables cleared)")
            namespace.clear()
            namespace.update(initial)
        except SystemExit as exc:
            raise NotebookError(
                f"{name}: cell {cell.number} called sys.exit({exc.code!r}). On Databricks "
                f"sys.exit does not end a notebook cleanly; use dbutils.notebook.exit(value) "
                f"to end it successfully, or raise an exception to fail it."
            ) from exc
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)
            line = next(
                (f.lineno for f in reversed(tb) if f.filename.endswith(f"[cell {cell.number}]")),
                None,
            )
            _log.error(f"{name}: cell {cell.number} raised", exc_info=True)
            raise NotebookError(
                f"{name}: cell {cell.number} failed at line {line}: {type(exc).__name__}: {exc}"
            ) from exc
    return None


def check_params(paths: list[str], params: dict[str, str]) -> None:
    """Refuse parameters that no notebook of the chain defines as a widget.

    Raises:
        ValueError: naming the unknown parameters and each notebook's widgets.
    """
    defined = {path: widgets(path) for path in paths}
    known = {w for ws in defined.values() for w in ws}
    unknown = sorted(set(params) - known)
    if unknown:
        listing = "; ".join(
            f"{Path(p).name}: {', '.join(ws) or '(none)'}" for p, ws in defined.items()
        )
        raise ValueError(
            f"unknown parameter(s) {unknown}: no notebook defines such a widget, so the value "
            f"would be ignored. Widgets: {listing}"
        )


def _fail_open_run(error: str) -> None:
    """A failed notebook must not leave its MLflow run RUNNING (or, later, FINISHED)."""
    try:
        import mlflow
    except ImportError:
        return
    if mlflow.active_run() is not None:
        from hvdrunner import tracking

        tracking.mark_failed(error, [])


def run(
    paths: list[str], params: dict[str, str], task_values_file: str, master: str, job: bool = True
) -> int:
    """Run notebooks in order as the tasks of one job; 0 on success, 1 on a failed cell,
    2 on bad input (not a notebook, unknown parameter), before anything runs.
    ``job=False``: as notebooks run by hand (task values only through ``debugValue``)."""
    try:
        for path in paths:
            parse(path)
        check_params(paths, params)
    except (OSError, ValueError) as exc:
        say(f"ERROR: {exc}", err=True)
        return 2
    from pyspark.sql import SparkSession

    from hvdrunner.spark import local_session

    t0 = time.monotonic()
    # A session that was there before (the caller's) is used and left running.
    ours = SparkSession.getActiveSession() is None
    spark = local_session(master, app_name="hvdrunner-notebooks")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for i, path in enumerate(paths, start=1):
            _log.info(f"[{i}/{len(paths)}] running {path} (task {task_key(path)})")
            dbutils = LocalDbutils(params, task_values_file, task_key(path), job=job)
            namespace = {
                "__name__": "__main__",
                "spark": spark,
                "sc": spark.sparkContext,
                "dbutils": dbutils,
                "display": display,
            }
            run_notebook(path, namespace)
    except NotebookError as exc:
        _fail_open_run(str(exc))
        say(f"\nERROR: {exc}", err=True)
        return 1
    except BaseException as exc:
        _fail_open_run(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if ours:
            spark.stop()
    _log.info(f"done: {len(paths)} notebook(s) in {time.monotonic() - t0:.0f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hvdrunner.notebook",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run notebooks in order, sharing Spark and task values")
    r.add_argument("notebooks", nargs="+")
    r.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="widget value (repeatable)",
    )
    r.add_argument(
        "--task-values", default=".hvdrunner/task_values.json", help="where task values persist"
    )
    r.add_argument("--master", default=os.environ.get("HVDRUNNER_SPARK_MASTER", "local[2]"))
    r.add_argument(
        "--interactive",
        action="store_true",
        help="as notebooks run by hand, not as a job: task values come only from debugValue",
    )
    args = parser.parse_args(argv)
    params = {}
    for item in args.param:
        if "=" not in item:
            parser.error(f"--param {item!r}: expected NAME=VALUE")
        key, value = item.split("=", 1)
        params[key.strip()] = value
    for path in args.notebooks:
        if not Path(path).is_file():
            parser.error(f"{path}: no such notebook")
    return run(args.notebooks, params, args.task_values, args.master, job=not args.interactive)


if __name__ == "__main__":
    sys.exit(main())
