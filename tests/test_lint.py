"""Style is part of the suite: ruff and mypy (configured in pyproject.toml) must be clean,
on the TensorFlow stacks and, with torch's real types, on 19."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stack", [
    "tensorflow", pytest.param("torch", marks=pytest.mark.torch)])  # fmt: skip
def test_ruff_check_is_clean(stack):
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "src", "tests", "benchmarks", "scripts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("stack", [
    "tensorflow", pytest.param("torch", marks=pytest.mark.torch)])  # fmt: skip
def test_mypy_is_clean(stack):
    # Full type hints are a house rule; mypy (configured in pyproject.toml) holds us to it.
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
