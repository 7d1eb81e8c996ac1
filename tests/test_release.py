"""The package as a package index would take it (`make release`): an sdist and a wheel built
from the repository's files, `twine check --strict` passing, the version in one place and
at the top of CHANGELOG.md, nothing but the package in the wheel."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import hvdrunner

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_builds_and_passes_twine_check(tmp_path):
    src = tmp_path / "src-tree"  # a copy: building writes build/ and egg-info beside it
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "src", src / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    version = hvdrunner.__version__
    wheel = dist / f"hvdrunner-{version}-py3-none-any.whl"
    assert wheel.is_file() and (dist / f"hvdrunner-{version}.tar.gz").is_file(), list(
        dist.iterdir()
    )
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    names = zipfile.ZipFile(wheel).namelist()
    assert "hvdrunner/py.typed" in names and "hvdrunner/log4j2-local.properties" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "notebooks/"))]
    meta = zipfile.ZipFile(wheel).read(f"hvdrunner-{version}.dist-info/METADATA").decode()
    assert "Requires-Dist: cloudpickle>=2.2" in meta and "Classifier: Typing :: Typed" in meta


def test_the_changelog_starts_with_this_version():
    first = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert first and first.group(1) == hvdrunner.__version__
