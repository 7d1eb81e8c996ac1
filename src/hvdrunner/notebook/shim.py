"""A local stand-in for the Databricks notebook globals: ``dbutils`` and ``display``.

Only what hvdrunner's notebooks use: widgets, ``jobs.taskValues``, ``notebook.exit``,
``library.restartPython``. Task values persist in a JSON file so that notebooks run one after
another chain as the tasks of a job do. As on Databricks: outside a job run (``job=False``,
a notebook run by hand) ``taskValues.get`` returns its ``debugValue`` and raises without
one; ``restartPython()`` ends the cell and clears the notebook's variables.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hvdrunner._console import say


class NotebookExit(Exception):  # noqa: N818 - mirrors dbutils.notebook.exit
    """Raised by ``dbutils.notebook.exit(value)``: stops the notebook, successfully."""

    def __init__(self, value: str) -> None:
        super().__init__(value)
        self.value = value


class PythonRestart(Exception):  # noqa: N818 - a signal to the runner, not an error
    """Raised by ``dbutils.library.restartPython()``: the runner clears the namespace."""


class _Widgets:
    def __init__(self, params: Mapping[str, str]) -> None:
        self._params = dict(params)
        self._values: dict[str, str] = {}

    def _define(self, name: str, default: str) -> None:
        self._values[name] = self._params.get(name, str(default))

    def text(self, name: str, defaultValue: str = "", label: str | None = None) -> None:  # noqa: N803
        self._define(name, defaultValue)

    def dropdown(
        self, name: str, defaultValue: str, choices: Sequence[str], label: str | None = None
    ) -> None:  # noqa: N803
        self._define(name, defaultValue)
        if self._values[name] not in choices:
            raise ValueError(
                f"widget {name!r}: {self._values[name]!r} is not one of {list(choices)}"
            )

    combobox = text

    def get(self, name: str) -> str:
        if name not in self._values:
            raise KeyError(
                f"InputWidgetNotDefined: no widget named {name!r}; define it with dbutils.widgets.text first"
            )
        return self._values[name]

    getArgument = get  # noqa: N815 - Databricks' name

    def removeAll(self) -> None:  # noqa: N802
        self._values.clear()

    def defined(self) -> dict[str, str]:
        return dict(self._values)


class _TaskValues:
    def __init__(self, store: str, task_key: str, job: bool) -> None:
        self._store = store
        self._task_key = task_key
        self._job = job

    def _load(self) -> dict[str, dict[str, Any]]:
        if not os.path.exists(self._store):
            return {}
        with open(self._store) as f:
            return json.load(f)

    def set(self, key: str, value: Any) -> None:
        data = self._load()
        data.setdefault(self._task_key, {})[key] = value
        os.makedirs(os.path.dirname(os.path.abspath(self._store)), exist_ok=True)
        tmp = f"{self._store}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self._store)

    def get(self, taskKey: str, key: str, default: Any = None, debugValue: Any = None) -> Any:  # noqa: N803
        if not self._job:  # Databricks' behaviour in a notebook run by hand
            if debugValue is None:
                raise TypeError(
                    "Must pass debugValue when calling get outside of a job context. "
                    "debugValue cannot be None."
                )
            return debugValue
        value = self._load().get(taskKey, {}).get(key)
        if value is not None:
            return value
        if default is not None:
            return default
        raise ValueError(f"no task value {key!r} from task {taskKey!r}; run that notebook first")


class _Jobs:
    def __init__(self, store: str, task_key: str, job: bool) -> None:
        self.taskValues = _TaskValues(store, task_key, job)


class _Library:
    def restartPython(self) -> None:  # noqa: N802 - Databricks' name
        raise PythonRestart()


class _Notebook:
    def exit(self, value: Any) -> None:
        raise NotebookExit(str(value))


class LocalDbutils:
    """``dbutils`` for local runs; ``job=False`` behaves as a notebook run by hand."""

    def __init__(
        self, params: Mapping[str, str], task_values_file: str, task_key: str, job: bool = True
    ) -> None:
        self.widgets = _Widgets(params)
        self.jobs = _Jobs(task_values_file, task_key, job)
        self.notebook = _Notebook()
        self.library = _Library()


def display(obj: Any, *args: Any, **kwargs: Any) -> None:
    """Print a Spark or pandas DataFrame (first 20 rows) or anything else."""
    if hasattr(obj, "show") and hasattr(obj, "schema"):
        obj.show(20, truncate=60)
    else:
        say(str(obj))
