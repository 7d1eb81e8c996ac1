"""Notebook parameters: defaults that work on Databricks and here, and upstream task values.

On Databricks (``DATABRICKS_RUNTIME_VERSION`` set) a folder default is in the Unity Catalog
volume ``hvdrunner`` of the session's *current* catalog and schema (no ``main`` catalog is
assumed) and the MLflow experiment is in the user's workspace folder; anywhere else they are
``./.hvdrunner/<name>`` and a plain experiment name, so the notebooks run unchanged on a
laptop.
"""

from __future__ import annotations

import os
from typing import Any

from hvdrunner._logging import get_logger
from hvdrunner._paths import on_databricks

#: Where Unity Catalog volumes are mounted on a Databricks node (tests point it elsewhere).
VOLUMES_ENV = "HVDRUNNER_VOLUMES_ROOT"
VOLUME = "hvdrunner"


def _session() -> Any:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise RuntimeError("no active SparkSession: notebook defaults need the notebook's `spark`")
    return spark


def storage_root() -> str:
    """The folder the notebooks keep data, cache, checkpoints and predictions under.

    On Databricks: ``/Volumes/<current catalog>/<current schema>/hvdrunner``, with a warning
    naming the ``CREATE VOLUME`` statement when that volume does not exist (set the folder
    widgets instead to use another place). Elsewhere: ``./.hvdrunner``.

    Example:
        >>> storage_root()  # off Databricks  # doctest: +SKIP
        '/home/me/project/.hvdrunner'
    """
    if not on_databricks():
        return os.path.join(os.getcwd(), ".hvdrunner")
    spark = _session()
    catalog, schema = spark.catalog.currentCatalog(), spark.catalog.currentDatabase()
    root = f"{os.environ.get(VOLUMES_ENV, '/Volumes')}/{catalog}/{schema}/{VOLUME}"
    if not os.path.isdir(root):
        get_logger().warning(
            f"{root} does not exist: create it once (SQL: CREATE VOLUME {catalog}.{schema}."
            f"{VOLUME}; or `databricks volumes create {catalog} {schema} {VOLUME} MANAGED`), or "
            f"set this notebook's folder widgets to a volume you can write"
        )
    return root


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
