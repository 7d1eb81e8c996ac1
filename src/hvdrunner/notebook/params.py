"""Notebook parameters: defaults that work on Databricks and here, and upstream task values.

On Databricks (``DATABRICKS_RUNTIME_VERSION`` set) a folder default is in the Unity Catalog
volume ``hvdrunner`` of the session's *current* catalog and schema (no ``main`` catalog is
assumed) and the MLflow experiment is in the user's workspace folder; anywhere else they are
``./.hvdrunner/<name>`` and a plain experiment name, so the notebooks run unchanged on a
laptop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hvdrunner._logging import get_logger
from hvdrunner._paths import on_databricks
from hvdrunner.workspace import VOLUME

#: Where Unity Catalog volumes are mounted on a Databricks node (tests point it elsewhere).
VOLUMES_ENV = "HVDRUNNER_VOLUMES_ROOT"


def _session() -> Any:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise RuntimeError("no active SparkSession: notebook defaults need the notebook's `spark`")
    return spark


def storage_root() -> str:
    """The folder the notebooks keep data, cache, checkpoints and predictions under.

    On Databricks: ``/Volumes/<current catalog>/<current schema>/hvdrunner`` (a write to a
    volume that does not exist names the ``CREATE VOLUME`` statement: ``_paths.require_volumes``;
    nothing is said here, where a job that passes its own folders only builds a default).
    Elsewhere: ``./.hvdrunner``.

    Example:
        >>> storage_root()  # off Databricks  # doctest: +SKIP
        '/home/me/project/.hvdrunner'
    """
    if not on_databricks():
        return os.path.join(os.getcwd(), ".hvdrunner")
    spark = _session()
    catalog, schema = spark.catalog.currentCatalog(), spark.catalog.currentDatabase()
    return f"{os.environ.get(VOLUMES_ENV, '/Volumes')}/{catalog}/{schema}/{VOLUME}"


def default_dir(name: str) -> str:
    """A notebook's default folder ``name`` under :func:`storage_root`.

    Example:
        >>> default_dir("data")  # off Databricks  # doctest: +SKIP
        '/home/me/project/.hvdrunner/data'
    """
    return f"{storage_root()}/{name}" if on_databricks() else os.path.join(storage_root(), name)


def default_experiment(name: str) -> str:
    """An MLflow experiment a notebook can create: ``/Users/<current user>/<name>`` on
    Databricks (a workspace wants a workspace path), ``name`` elsewhere.

    Example:
        >>> default_experiment("hvdrunner-digits")  # off Databricks
        'hvdrunner-digits'
    """
    if not on_databricks():
        return name
    user = _session().sql("SELECT current_user()").first()[0]
    return f"/Users/{user}/{name}"


def upstream(
    dbutils: Any,
    widget: str,
    task: str,
    key: str | None = None,
    by_hand: Callable[[], Any] | None = None,
) -> Any:
    """The widget's value if set, else task ``task``'s task value ``key`` (default: ``widget``),
    else - a notebook run by hand has no task values - ``by_hand()``: where the upstream
    notebook writes with its own defaults (None when it has not).

    Raises:
        ValueError: none of the three has a value, naming the widget, the task and the fix.

    Example:
        >>> train_path = upstream(dbutils, "train_path", "prepare_data")  # doctest: +SKIP
    """
    value = dbutils.widgets.get(widget)
    if value:
        return value
    value = dbutils.jobs.taskValues.get(task, key or widget, debugValue="")
    if value in ("", None) and by_hand is not None:
        value = by_hand()
        if value not in ("", None):
            get_logger().info(f"{widget}: {value} (what {task} wrote with its defaults)")
    if value in ("", None):
        raise ValueError(
            f"widget {widget!r} is empty, there is no task value {key or widget!r} from task "
            f"{task!r} (a notebook run by hand has none) and {task} has not written one with its "
            f"defaults: run that notebook first, set the {widget!r} widget, or run the notebooks "
            f"as the job"
        )
    return value
