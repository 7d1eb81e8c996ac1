"""Marks a rank leaves when it reaches a test's function - one file per attempt and rank - and
which attempts reached it: how the restart tests see what ran (the ``marks`` fixture,
tests/conftest.py, gives each test its folder)."""

from __future__ import annotations

from pathlib import Path

from hvdrunner.distributed import attempt, rank


def mark(marks: str) -> None:
    """In a rank: ``<marks>/attempt<N>-rank<R>``."""
    Path(marks, f"attempt{attempt()}-rank{rank()}").touch()


def attempts_run(marks: Path) -> list[str]:
    """The attempts whose ranks reached the function (a rank stopped by the abort of its
    attempt may not have: only the attempt is counted)."""
    return sorted({p.name.split("-")[0] for p in marks.iterdir()})
