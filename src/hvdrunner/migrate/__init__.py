"""``python -m hvdrunner migrate PATH...``: move a HorovodRunner notebook to hvdrunner.

Rewrites the imports that have a drop-in (``sparkdl``, Horovod's Keras layer, which trains
ranks apart under Keras 3, ``horovod.torch``, which needs a horovod compiled for its torch,
and ``petastorm.spark``), in Databricks' source format (``# Databricks notebook source``),
plain ``.py`` and ``.ipynb``, however the import is written (migrate.cells parses each cell);
shows the change as a unified diff (a dry run unless ``--write``); and lists every other
import of sparkdl or horovod and what still needs a hand, each with its line and fix
(Horovod elastic, ``horovod.spark.run``, Horovod's Spark estimators, MPI, petastorm readers,
any install of horovod or sparkdl). Every file is read and checked before any is written
(migrate.files): a run writes all of its files or none.

Example:
    >>> report = migrate_text("from sparkdl import HorovodRunner\\n", "nb.py")
    >>> report.text
    'from hvdrunner import HorovodRunner\\n'
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from hvdrunner.migrate.cells import Finding, migrate_cell

_COMMAND = re.compile(r"^# COMMAND -{5,}\s*$")


@dataclass
class Report:
    """What :func:`migrate_text` did to one notebook."""

    path: str
    text: str
    rewritten: list[tuple[int, str]] = field(default_factory=list)  # (line, why)
    manual: list[Finding] = field(default_factory=list)
    hints: list[Finding] = field(default_factory=list)  # petastorm -> Mosaic Streaming
    notes: list[str] = field(default_factory=list)

    def diff(self, before: str) -> str:
        return "".join(
            difflib.unified_diff(
                before.splitlines(True),
                self.text.splitlines(True),
                f"a/{self.path}",
                f"b/{self.path}",
            )  # fmt: skip
        )


def migrate_text(text: str, path: str) -> Report:
    """The notebook source ``text`` (Databricks' source format or plain Python) rewritten,
    and what needs a hand, numbered by the file's lines.

    Example:
        >>> r = migrate_text("import horovod.tensorflow.keras as hvd\\nhvd.elastic.run\\n", "n.py")
        >>> r.text.splitlines()[0], [f.what for f in r.manual]
        ('import hvdrunner.hvd_keras as hvd', ['Horovod elastic'])
    """
    report = Report(path, "")
    lines = text.splitlines(True)
    out: list[str] = []
    cell: list[str] = []
    for line in [*lines, None]:
        if line is not None and not _COMMAND.match(line):
            cell.append(line)
            continue
        offset = len(out)
        done = migrate_cell(cell)
        report.rewritten += [(offset + n, why) for n, why in done.rewritten]
        report.manual += [Finding(offset + f.line, f.text, f.what, f.fix) for f in done.manual]
        report.hints += [Finding(offset + f.line, f.text, f.what, f.fix) for f in done.hints]
        out += done.lines
        if line is not None:
            out.append(line)
        cell = []
    report.text = "".join(out)
    return report


def migrate_ipynb(text: str, path: str) -> Report:
    """An ``.ipynb``: each code cell migrated, findings numbered by cell and line as Jupyter
    shows them; the file keeps its own JSON layout, so only the changed cells differ."""
    nb = json.loads(text)
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("not a notebook: its JSON has no list of cells")
    report = Report(path, text)
    changed = []
    for number, cell in enumerate(nb["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        joined = "".join(source) if isinstance(source, list) else str(source)
        done = migrate_cell(joined.splitlines(True))
        report.manual += [Finding(f.line, f.text, f.what, f.fix, number) for f in done.manual]
        report.hints += [Finding(f.line, f.text, f.what, f.fix, number) for f in done.hints]
        if done.rewritten:
            report.rewritten += done.rewritten
            new = "".join(done.lines)
            changed.append((cell, new.splitlines(True) if isinstance(source, list) else new))
    if not changed:
        return report
    layout = _layout(nb, text)  # read off the notebook as it was, before the changes
    if layout is None:
        layout = {"indent": 1, "ensure_ascii": False, "sort_keys": False, "end": "\n"}
        report.notes.append("its JSON layout is not one this tool reproduces: the file is "
                            "written with Jupyter's (one-space indent)")  # fmt: skip
    for cell, source in changed:
        cell["source"] = source
    end = layout.pop("end")
    report.text = json.dumps(nb, **layout) + end
    return report


def _layout(nb: Any, text: str) -> dict[str, Any] | None:
    """The ``json.dumps`` settings that write ``nb`` back as ``text`` byte for byte, if any do."""
    for indent in (1, 2, 4, None):
        for sort_keys in (False, True):
            for ensure_ascii in (False, True):
                written = json.dumps(nb, indent=indent, sort_keys=sort_keys,
                                     ensure_ascii=ensure_ascii)  # fmt: skip
                for end in ("\n", ""):
                    if written + end == text:
                        return {"indent": indent, "sort_keys": sort_keys,
                                "ensure_ascii": ensure_ascii, "end": end}  # fmt: skip
    return None


def migrate_source(text: str, path: str) -> Report:
    """One notebook's text, by the kind its ``path`` names (``.ipynb``, else Python)."""
    return migrate_ipynb(text, path) if path.endswith(".ipynb") else migrate_text(text, path)


def as_text(raw: bytes) -> str:
    """A notebook file's bytes as text, newlines as Python's text mode reads them
    (``UnicodeDecodeError`` when they are not UTF-8)."""
    return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def migrate_file(path: str) -> tuple[str, Report]:
    """``(before, report)`` for one notebook file (``.py`` or ``.ipynb``), read as UTF-8."""
    with open(path, "rb") as f:
        before = as_text(f.read())
    return before, migrate_source(before, path)


__all__ = [
    "Finding",
    "Report",
    "as_text",
    "migrate_file",
    "migrate_ipynb",
    "migrate_source",
    "migrate_text",
]
