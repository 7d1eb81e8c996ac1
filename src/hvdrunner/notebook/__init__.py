"""Run Databricks source-format notebooks locally, as the tasks of one job.

- ``run``: the cell runner (``python -m hvdrunner.notebook run NOTEBOOK... --param k=v``).
- ``shim``: the local ``dbutils`` (widgets, task values, ``notebook.exit``,
  ``library.restartPython``) and ``display``.
- ``upstream``: a widget's value, else an upstream task's value (the shipped notebooks);
  ``default_dir``, ``default_experiment``: defaults that are a volume of the current
  catalog and schema and a workspace path on Databricks, local elsewhere.

Example:
    >>> from hvdrunner.notebook import run  # doctest: +SKIP
    >>> run(["notebooks/01_prepare_data.py"], {"np": "2"}, ".hvdrunner/tv.json", "local[2]")
"""

from hvdrunner.notebook.params import default_dir, default_experiment, storage_root, upstream
from hvdrunner.notebook.run import (
    NotebookError,
    check_params,
    main,
    parse,
    run,
    run_notebook,
    task_key,
    widgets,
)
from hvdrunner.notebook.shim import LocalDbutils, NotebookExit

__all__ = [
    "LocalDbutils",
    "NotebookError",
    "NotebookExit",
    "check_params",
    "default_dir",
    "default_experiment",
    "main",
    "parse",
    "run",
    "run_notebook",
    "storage_root",
    "task_key",
    "upstream",
    "widgets",
]
