"""A copy of the repository's tracked files, for tests that build, install or deploy from a
checkout: what they write (dist/, build/, egg-info) lands in the copy, never in the checkout
under test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_repository(dest: Path) -> Path:
    """The tracked files (``git ls-files``: also those added but not yet committed) copied
    to ``dest``; returns ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest
