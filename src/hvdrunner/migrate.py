"""``python -m hvdrunner migrate PATH...``: move a HorovodRunner notebook to hvdrunner.

Rewrites the imports that have a drop-in (``sparkdl``, Horovod's Keras layer, which trains
ranks apart under Keras 3, ``horovod.torch``, which needs a horovod compiled for its torch,
and ``petastorm.spark``), in Databricks' source format
(``# Databricks notebook source``), plain ``.py`` and ``.ipynb``; shows the change as a
unified diff (a dry run unless ``--write``); and lists what still needs a hand, each with
its fix (Horovod elastic, ``horovod.spark.run``, Horovod's Spark estimators, MPI, petastorm
readers, a ``%pip install`` of horovod or sparkdl). Nothing is written without
``--write``; a written file is replaced whole (a temporary file renamed over it).

Example:
    >>> report = migrate_text("from sparkdl import HorovodRunner\\n", "nb.py")
    >>> report.text
    'from hvdrunner import HorovodRunner\\n'
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from hvdrunner._console import say


@dataclass(frozen=True)
class Rule:
    """A line pattern; ``replace`` set: rewritten (a drop-in); else reported with ``fix``."""

    pattern: re.Pattern[str]
    what: str
    fix: str
    replace: str | None = None


def _rule(pattern: str, what: str, fix: str, replace: str | None = None) -> Rule:
    return Rule(re.compile(pattern), what, fix, replace)


_SPARKDL_NAMES = r"(?:HorovodRunner|log_to_driver)(?:\s*,\s*(?:HorovodRunner|log_to_driver))*"

#: Imports with a drop-in, rewritten in place (the line's indentation and alias kept).
REWRITES: tuple[Rule, ...] = (
    _rule(
        rf"^(\s*)from sparkdl(?:\.horovod)? import ({_SPARKDL_NAMES})\s*$",
        "sparkdl.HorovodRunner (absent after DBR 15.4 LTS ML)",
        "hvdrunner's HorovodRunner: the same np, driver_log_verbosity and run(main, **kwargs)",
        r"\1from hvdrunner import \2",
    ),  # fmt: skip
    _rule(
        r"^(\s*)import horovod\.(?:tensorflow\.keras|keras) as (\w+)\s*$",
        "Horovod's Keras layer (under Keras 3 it does not average gradients: ranks train "
        "apart without an error)",
        "hvdrunner.hvd_keras: the same names (init, DistributedOptimizer, callbacks, ...) on "
        "Keras 2 and 3",
        r"\1import hvdrunner.hvd_keras as \2",
    ),  # fmt: skip
    _rule(
        r"^(\s*)from horovod\.(?:tensorflow\.keras|keras) import ",
        "Horovod's Keras layer (see above)",
        "hvdrunner.hvd_keras",
        r"\1from hvdrunner.hvd_keras import ",
    ),  # fmt: skip
    _rule(
        r"^(\s*)import horovod\.torch as (\w+)\s*$",
        "horovod.torch (a horovod compiled for this torch: 0.28.1 does not build for torch "
        ">= 2.1 unpatched)",
        "hvdrunner.hvd_torch: Horovod's PyTorch API on torch.distributed (gloo, NCCL), the "
        "same names, nothing compiled",
        r"\1import hvdrunner.hvd_torch as \2",
    ),  # fmt: skip
    _rule(
        r"^(\s*)from horovod\.torch(\.elastic)? import ",
        "horovod.torch (see above)",
        "hvdrunner.hvd_torch",
        r"\1from hvdrunner.hvd_torch\2 import ",
    ),  # fmt: skip
    _rule(
        r"^(\s*)from petastorm(?:\.transform)? import TransformSpec\s*$",
        "petastorm.TransformSpec (decoding on the ranks)",
        "hvdrunner.petastorm.TransformSpec: the same arguments, honoured by make_tf_dataset "
        "and make_torch_dataloader",
        r"\1from hvdrunner.petastorm import TransformSpec",
    ),  # fmt: skip
    _rule(
        r"^(\s*)from petastorm\.spark import ",
        "petastorm.spark (petastorm 0.13.1 needs pyarrow < 15; runtimes after 15.4 have newer)",
        "hvdrunner.petastorm.spark: make_spark_converter, SparkDatasetConverter",
        r"\1from hvdrunner.petastorm.spark import ",
    ),  # fmt: skip
)

#: What has no drop-in: reported with the fix, never rewritten.
MANUAL: tuple[Rule, ...] = (
    _rule(
        r"\bhorovod\.spark\.run\s*\(|\bfrom horovod\.spark import run\b|\bhvd_spark\.run\s*\(",
        "horovod.spark.run(fn, args=..., num_proc=N)",
        "HorovodRunner(np=N).run(fn, **kwargs): keyword arguments instead of args=(...), "
        "rank 0's value instead of a list of every rank's",
    ),  # fmt: skip
    _rule(
        r"\bhorovod\.spark\.(?:keras|torch|lightning)\b|\b(?:KerasEstimator|TorchEstimator|LightningEstimator)\b",
        "Horovod's Spark estimators",
        "not provided: hvdrunner.keras.fit / hvdrunner.torch.fit on hvdrunner.data.prepare(df) "
        "under HorovodRunner",
    ),  # fmt: skip
    _rule(
        r"\bhvd\.elastic\b|\bhorovod\.\w+(?:\.keras)?\.elastic\b",
        "Horovod elastic",
        "PyTorch: unchanged @hvd.elastic.run code resumes from its last state.commit() after "
        "a restart with HorovodRunner(max_restarts=N); Keras: not supported (hvd_keras.elastic "
        "raises), use hvdrunner.keras.fit(checkpoint_dir=...) with max_restarts",
    ),  # fmt: skip
    _rule(
        r"\b(?:make_batch_reader|make_reader|make_petastorm_dataset)\b",
        "petastorm's readers",
        "the converter API (hvdrunner.petastorm.spark) or hvdrunner.data.prepare(df)",
    ),  # fmt: skip
    _rule(
        r"%pip install\b.*\b(?:horovod|sparkdl)\b",
        "installs horovod or sparkdl from PyPI (horovod 0.28.1 does not build for current "
        "runtimes' TensorFlow and PyTorch unpatched)",
        "install hvdrunner's wheels instead: %pip install -r /Volumes/<catalog>/<schema>/"
        "hvdrunner/wheels/<runtime>/requirements.txt (what hvdrunner_build_horovod publishes)",
    ),  # fmt: skip
    _rule(
        r"\bmpirun\b|\bhvd\.mpi_\w+\(|HOROVOD_MPI|\bmpi4py\b",
        "MPI",
        "hvdrunner runs Horovod over gloo only (no MPI): remove the MPI-specific code",
    ),  # fmt: skip
)


@dataclass(frozen=True)
class Finding:
    """One line that needs a hand (``line``: 1-based in the notebook's text)."""

    line: int
    text: str
    what: str
    fix: str


@dataclass
class Report:
    """What :func:`migrate_text` did to one notebook."""

    path: str
    text: str
    rewritten: list[tuple[int, str]] = field(default_factory=list)  # (line, why)
    manual: list[Finding] = field(default_factory=list)

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
    """The notebook source ``text`` rewritten, and what needs a hand (a ``# MAGIC %pip``
    line of the source format is checked like the code).

    Example:
        >>> r = migrate_text("import horovod.tensorflow.keras as hvd\\nhvd.elastic.run\\n", "n.py")
        >>> r.text.splitlines()[0], [f.what for f in r.manual]
        ('import hvdrunner.hvd_keras as hvd', ['Horovod elastic'])
    """
    report = Report(path, "")
    out = []
    for number, line in enumerate(text.splitlines(True), start=1):
        body, end = line.rstrip("\r\n"), line[len(line.rstrip("\r\n")) :]
        for rule in REWRITES:
            new = rule.pattern.sub(rule.replace or "", body) if rule.replace else body
            if new != body:
                report.rewritten.append((number, rule.what))
                body = new
                break
        for rule in MANUAL:
            if rule.pattern.search(body):
                report.manual.append(Finding(number, body.strip(), rule.what, rule.fix))
                break
        out.append(body + end)
    report.text = "".join(out)
    return report


def _ipynb(text: str, path: str) -> Report:
    """An ``.ipynb``: each code cell migrated; lines numbered through the code cells."""
    nb = json.loads(text)
    merged = Report(path, "")
    offset = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        joined = "".join(source) if isinstance(source, list) else source
        report = migrate_text(joined, path)
        merged.rewritten += [(offset + n, why) for n, why in report.rewritten]
        merged.manual += [Finding(offset + f.line, f.text, f.what, f.fix) for f in report.manual]
        offset += len(joined.splitlines())
        cell["source"] = report.text.splitlines(True) if isinstance(source, list) else report.text
    merged.text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    return merged


def migrate_file(path: str) -> tuple[str, Report]:
    """``(before, report)`` for one notebook file (``.py`` or ``.ipynb``)."""
    with open(path, encoding="utf-8") as f:
        before = f.read()
    if path.endswith(".ipynb"):
        report = _ipynb(before, path)
        if not report.rewritten:
            report.text = before  # untouched: never reformat a file that needs no change
    else:
        report = migrate_text(before, path)
    return before, report


def _write(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, encoding="utf-8",
                                     prefix=".migrate-") as f:  # fmt: skip
        f.write(text)
    os.replace(f.name, path)


def _notebooks(paths: Sequence[str]) -> list[str]:
    found = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                found += [os.path.join(root, n) for n in sorted(names)
                          if n.endswith((".py", ".ipynb"))]  # fmt: skip
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """``hvdrunner migrate PATH... [--write]``: exit 0, or 2 for a path that does not exist."""
    parser = argparse.ArgumentParser(prog="hvdrunner migrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="notebooks (.py source format, .ipynb) or folders")
    parser.add_argument(
        "--write", action="store_true", help="apply the rewrites (default: show them)"
    )
    args = parser.parse_args(argv)
    try:
        files = _notebooks(args.paths)
    except FileNotFoundError as exc:
        say(f"ERROR: {exc}", err=True)
        return 2
    changed = hand = 0
    for path in files:
        before, report = migrate_file(path)
        if report.rewritten:
            changed += 1
            say(report.diff(before), end="")
            if args.write:
                _write(path, report.text)
        for f in report.manual:
            hand += 1
            say(f"{path}:{f.line}: needs a hand: {f.what}: `{f.text}`\n    fix: {f.fix}")
    verb = "rewrote" if args.write else "would rewrite (dry run; --write applies)"
    say(
        f"hvdrunner migrate: {len(files)} notebook(s); {verb} {changed}; {hand} line(s) need a hand"
    )
    return 0
