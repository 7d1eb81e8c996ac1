"""Notebook parameters that fall back to an upstream task's value, on Databricks and here."""

from __future__ import annotations

import os
from typing import Any

#: Where the shipped notebooks keep their files on Databricks when no widget says otherwise.
DATABRICKS_ROOT = "/Volumes/main/default/hvdrunner"


def default_dir(name: str) -> str:
    """A notebook's default folder ``name``: under :data:`DATABRICKS_ROOT` on Databricks,
    under ``./.hvdrunner`` anywhere else, so the notebooks run unchanged on a laptop.

    Example:
        >>> default_dir("data")  # off Databricks  # doctest: +SKIP
        '/home/me/project/.hvdrunner/data'
    """
    if "DATABRICKS_RUNTIME_VERSION" in os.environ:
        return f"{DATABRICKS_ROOT}/{name}"
    return os.path.join(os.getcwd(), ".hvdrunner", name)


def upstream(dbutils: Any, widget: str, task: str, key: str | None = None) -> Any:
    """The widget's value if set, else task ``task``'s task value ``key`` (default: ``widget``).

    In a job run the upstream task's value is used. In a notebook run by hand there are no
    task values (Databricks raises unless ``debugValue`` is given), so the widget must be set.

    Raises:
        ValueError: the widget is empty and no task value exists, naming both and the fix.

    Example:
        >>> train_path = upstream(dbutils, "train_path", "prepare_data")  # doctest: +SKIP
    """
    value = dbutils.widgets.get(widget)
    if value:
        return value
    value = dbutils.jobs.taskValues.get(task, key or widget, debugValue="")
    if value in ("", None):
        raise ValueError(
            f"widget {widget!r} is empty and there is no task value {key or widget!r} from task "
            f"{task!r} (a notebook run by hand has none): set the {widget!r} widget, or run the "
            f"notebooks as the job"
        )
    return value
