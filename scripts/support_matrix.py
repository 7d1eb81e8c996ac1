"""The support matrix: Databricks runtime x path, each cell from what CI's run of that
runtime's replica found, never typed.

Each `make test` stage writes what its tests did (tests/conftest.py, when
``HVDRUNNER_RESULTS_DIR`` is set; `.ci/run` sets it): the stack, the Keras backend and each
test id's outcome. ``record`` turns a run's folder of those files into
``benchmarks/results/support_matrix.json``; ``render`` prints the table README.md and
docs/stacks.md carry (tests/test_docs.py holds both to it). Standard library only.

    HVDRUNNER_RESULTS_DIR=/tmp/r bash .ci/run
    python scripts/support_matrix.py record /tmp/r --commit "$(git rev-parse --short HEAD)"
    python scripts/support_matrix.py render        # what README.md shows
    python scripts/support_matrix.py show /tmp/r   # a run's matrix, not recorded
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "support_matrix.json"

#: The runtimes, oldest first, as the stacks name their replicas.
RUNTIMES = ("15.4", "16.4", "17.3", "18", "19")


@dataclass(frozen=True)
class Column:
    """A path a user runs (one column), and the tests that prove it on a runtime."""

    title: str
    tests: tuple[str, ...]  # test ids, or a prefix of them ("tests/test_connect.py::")
    backend: str | None = None  # the Keras backend the stage must have, where it matters


PATHS = (
    Column("Keras on TensorFlow", ("tests/test_keras_fit.py::test_two_rank_fit_reaches_accuracy_and_mlflow_agrees",), "tensorflow"),
    Column("PyTorch", ("tests/test_torch_fit.py::test_two_rank_fit_reaches_accuracy_and_mlflow_agrees",)),
    Column("Keras on PyTorch", ("tests/test_keras_fit.py::test_two_rank_fit_reaches_accuracy_and_mlflow_agrees",), "torch"),
    Column("petastorm drop-in", ("tests/test_petastorm_recipes.py::",)),
    Column("Spark Connect", ("tests/test_connect.py::", "tests/test_connect_keras.py::")),
    Column("install + doctor", ("tests/test_workspace.py::test_the_install_cell_and_the_doctor_cell_pass_on_the_runtime",)),
)  # fmt: skip

#: Why a cell has no run, where there is a reason (a cell with none is a gap: "not run").
REASONS = {
    ("19", "Keras on TensorFlow"): "19 ships no TensorFlow",
    **{(r, "Keras on PyTorch"): "Keras runs on TensorFlow here; on PyTorch on 19"
       for r in ("15.4", "16.4", "17.3", "18")},
    **{(r, "petastorm drop-in"): "smoke tests only" for r in ("16.4", "17.3")},
    ("17.3", "Spark Connect"): "smoke tests only",
    # Spark 3.5's Connect server is a Maven package; pyspark's wheel bundles it from 4.0 on.
    **{(r, "Spark Connect"): "untestable here: Spark 3.5's Connect server is not in pip's pyspark"
       for r in ("15.4", "16.4")},
}  # fmt: skip


def _matches(test: str, wanted: tuple[str, ...]) -> bool:
    return any(test == w or (w.endswith("::") and test.startswith(w)) or
               test.startswith(w + "[") for w in wanted)  # fmt: skip


def cell(stages: list[dict], path: Column) -> str:
    """One cell from the runtime's stages: "pass" (its tests ran and passed), "FAIL", or ""
    (none ran).

    Example:
        >>> p = Column("doctor", ("t.py::a",))
        >>> cell([{"keras_backend": None, "outcomes": {"t.py::a": "passed"}}], p)
        'pass'
    """
    ran = [outcome for stage in stages if path.backend in (None, stage.get("keras_backend"))
           for test, outcome in stage["outcomes"].items() if _matches(test, path.tests)]  # fmt: skip
    ran = [o for o in ran if o != "skipped"]
    if not ran:
        return ""
    return "pass" if all(o == "passed" for o in ran) else "FAIL"


def record(folder: Path, commit: str) -> dict:
    """The matrix of one CI run's results folder (one file per stage)."""
    stages: dict[str, list[dict]] = {}
    for file in sorted(folder.glob("*.json")):
        stage = json.loads(file.read_text())
        stages.setdefault(stage["stack"], []).append(stage)
    missing = [r for r in RUNTIMES if r not in stages]
    if missing:
        raise SystemExit(
            f"{folder}: no results of the replicas {missing}: a whole CI run records all"
        )
    cells = {r: {p.title: cell(stages[r], p) for p in PATHS} for r in RUNTIMES}
    versions = {r: stages[r][0].get("versions", {}) for r in RUNTIMES}
    return {"commit": commit, "date": time.strftime("%Y-%m-%d"), "cells": cells,
            "versions": versions}  # fmt: skip


def render(matrix: dict) -> str:
    """The markdown table of a recorded matrix: a mark per cell, its reason where none ran.

    Example:
        >>> m = {"commit": "abc", "date": "2026-12-06",
        ...      "cells": {r: {p.title: "pass" for p in PATHS} for r in RUNTIMES}}
        >>> render(m).splitlines()[2].startswith("| 15.4 | ✓ | ✓ |")
        True
    """
    marks = {"pass": "✓", "FAIL": "✗"}
    head = "| runtime | " + " | ".join(p.title for p in PATHS) + " |"
    lines = [head, "|" + "---|" * (len(PATHS) + 1)]
    for runtime in RUNTIMES:
        row = []
        for p in PATHS:
            found = matrix["cells"][runtime][p.title]
            reason = REASONS.get((runtime, p.title))
            row.append(marks.get(found) or (f"– ({reason})" if reason else "not run"))
        lines.append(f"| {runtime} | " + " | ".join(row) + " |")
    lines.append(f"\nFrom CI's run of {matrix['commit']} ({matrix['date']}): "
                 "`python scripts/support_matrix.py render`.")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="write the matrix of a CI run's results folder")
    rec.add_argument("folder", type=Path)
    rec.add_argument("--commit", required=True)
    sub.add_parser("render", help="print the recorded matrix as markdown")
    show = sub.add_parser("show", help="print the matrix of a results folder (not recorded)")
    show.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        RECORD.write_text(json.dumps(record(args.folder, args.commit), indent=1) + "\n")
        print(f"wrote {RECORD.relative_to(ROOT)}")
    elif args.command == "show":
        print(render(record(args.folder, "this run")))
    else:
        print(render(json.loads(RECORD.read_text())))


if __name__ == "__main__":
    sys.exit(main())
