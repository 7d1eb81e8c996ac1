"""The Databricks install path, run here: scripts/databricks/build_horovod_wheel.py (the
bundle's hvdrunner_build_horovod job) against a fake ``/databricks/python`` layout, then the
install every training node does (a task library: pip with the wheel file). No workspace,
volume or GPU exists here: the volume is a local folder, the layout points at this stack's
venv, and ``PIP_NO_INDEX=1`` proves no step needs PyPI once the wheel exists."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.repo_copy import copy_repository

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "scripts" / "databricks" / "build_horovod_wheel.py"
BUILDER = ROOT / "scripts" / "install_horovod.sh"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _databricks_python(tmp_path: Path) -> Path:
    """tmp/databricks/python laid out like the runtime's: an environment of its own (what the
    job and the node install write goes there) that sees this venv's packages through a .pth
    after its own site-packages - the venv under test is never written (pip does not
    uninstall a package outside the environment it installs into)."""
    layout = tmp_path / "databricks" / "python"
    (layout / "bin").mkdir(parents=True)
    base = Path(os.path.realpath(sys._base_executable))  # type: ignore[attr-defined]
    (layout / "bin" / "python").symlink_to(base)
    venv = Path(sys.prefix)
    (layout / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    own = layout / "lib" / version / "site-packages"
    own.mkdir(parents=True)
    (own / "stack.pth").write_text(str(venv / "lib" / version / "site-packages") + "\n")
    return layout / "bin" / "python"


def _job(python: Path, out: Path, cache: Path, *extra: str, path: str | None = None):
    src = copy_repository(out.parent / "bundle-files")  # builds write there, not the checkout
    env = {**os.environ, **OFFLINE, "HVDRUNNER_HOROVOD_GPU": "none"}
    if path is not None:
        env["PATH"] = path
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(JOB), "--src", str(src), "--out", str(out), "--python", str(python),
         "--cache", str(cache), "--gpu", "none", *extra],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    return proc, time.monotonic() - start


def _cached_wheel_dir(python: Path) -> Path:
    key = subprocess.run(["bash", str(BUILDER), "--print-key"], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": str(python),
                              "HVDRUNNER_HOROVOD_FRAMEWORKS": "tensorflow"}).stdout.strip()  # fmt: skip
    cache = Path(os.path.expanduser("~/.cache/hvdrunner/wheels"))
    if not list((cache / key).glob("horovod-*.whl")):
        pytest.fail(f"no cached wheel for {key} in {cache}: the stack's setup builds it there")
    return cache


def test_the_job_publishes_a_cached_wheel_offline_and_every_node_installs_it(tmp_path):
    python = _databricks_python(tmp_path)
    cache = _cached_wheel_dir(python)
    volume = tmp_path / "Volumes" / "main" / "default" / "hvdrunner" / "wheels" / "runtime"
    proc, first = _job(python, volume, cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = volume.glob("horovod-0.28.1-cp3*-linux_x86_64.whl")
    info = json.loads(Path(f"{wheel}.json").read_text())
    assert info["key"].startswith("horovod-0.28.1-tf") and len(info["sha256"]) == 64
    assert f"- whl: {wheel}" in proc.stdout
    assert not [p for p in volume.iterdir() if p.name.startswith(".")]  # no partial files
    # hvdrunner's own wheel beside it, and one requirements file naming both: the line a
    # user runs in a cluster they already have.
    (ours,) = volume.glob("hvdrunner-*-py3-none-any.whl")
    requirements = volume / "requirements.txt"
    # ... and the TensorFlow it was built against (no --requires: the installed version).
    tf = info["frameworks"]["tensorflow"]
    assert [ln for ln in requirements.read_text().splitlines() if not ln.startswith("#")] == [
        str(ours), str(wheel), f"tensorflow=={tf}"]  # fmt: skip
    assert f"%pip install -r {requirements}" in proc.stdout
    assert "hvdrunner.doctor.check()" in proc.stdout  # a Python cell: the notebook's own env
    again, second = _job(python, volume, cache)
    assert again.returncode == 0 and "already built for" in again.stdout, again.stderr
    # A training node: the task library is pip with the wheel file (offline), then a check.
    start = time.monotonic()
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)],
        capture_output=True, text=True, env={**os.environ, **OFFLINE},
    )  # fmt: skip
    installed = time.monotonic() - start
    assert install.returncode == 0, install.stderr
    check = subprocess.run(
        [str(python), "-c", "import horovod.tensorflow, horovod._hvdrunner_gloo_iface; "
         "from horovod.common.util import gloo_built; assert gloo_built(); print('ok')"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.stdout.strip() == "ok", check.stderr
    print(f"publish {first:.1f}s, kept {second:.1f}s, node install {installed:.1f}s")


def test_without_a_wheel_or_build_tools_the_job_fails_loudly_and_leaves_nothing(tmp_path):
    python = _databricks_python(tmp_path)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "cmake").write_text("#!/bin/sh\necho 'cmake version 4.0.2'\n")
    (fake / "cmake").chmod(0o755)
    volume = tmp_path / "volume"
    proc, _ = _job(python, volume, tmp_path / "empty-cache", path=f"{fake}:/usr/bin:/bin")
    assert proc.returncode == 1
    assert "rejects horovod 0.28.1's CMake files" in proc.stdout + proc.stderr
    assert "ERROR: the horovod build failed" in proc.stderr
    assert list(volume.iterdir()) == []
    # Asked to install build tools with no PyPI reachable: the pip step is named.
    proc, _ = _job(python, volume, tmp_path / "empty-cache", "--install-build-tools",
                   path=f"{fake}:/usr/bin:/bin")  # fmt: skip
    assert proc.returncode == 1 and "ERROR: pip install cmake<4 failed" in proc.stderr
    assert list(volume.iterdir()) == []


def test_the_job_refuses_a_wrong_src_or_an_unwritable_volume(tmp_path):
    python = _databricks_python(tmp_path)

    def job(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(JOB), "--src", str(src), "--out", str(out), "--python", str(python)],
            capture_output=True, text=True,
        )  # fmt: skip

    bad_src = job(tmp_path, tmp_path / "o")
    assert bad_src.returncode == 1 and "has no scripts/install_horovod.sh" in bad_src.stderr
    assert "${workspace.file_path}" in bad_src.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad_out = job(ROOT, blocker / "sub")
    assert bad_out.returncode == 1 and "is not writable" in bad_out.stderr
    assert "CREATE VOLUME" in bad_out.stderr
    shutil.rmtree(tmp_path / "databricks")
