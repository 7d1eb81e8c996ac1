"""Build the hvdrunner wheel into a clean dist/ (the bundle's artifact build command).

Tasks attach ``dist/hvdrunner-*.whl``; a dist/ left from an earlier version would attach a
stale wheel beside the new one, so dist/ is emptied first and exactly one wheel must result.

    python scripts/build_wheel.py          # -> dist/hvdrunner-<version>-py3-none-any.whl
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    """Empty dist/, build one wheel into it, print its path."""
    dist = os.path.join(ROOT, "dist")
    shutil.rmtree(dist, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", dist, ROOT],
        check=True,
    )
    wheels = glob.glob(os.path.join(dist, "*.whl"))
    if [os.path.basename(w).split("-")[0] for w in wheels] != ["hvdrunner"]:
        print(f"ERROR: expected one hvdrunner wheel in {dist}, found {wheels}", file=sys.stderr)
        return 1
    print(wheels[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
