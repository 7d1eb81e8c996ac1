"""Notebook parameters that fall back to an upstream task's value, on Databricks and here."""

from __future__ import annotations

from typing import Any


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
