"""Jobs on hvdrunner's engine as a PyTorch user starts them: under torchrun (or another
launcher), with horovod unimportable (helpers/no_horovod) and hvdrunner from the source tree
or a built wheel's folder; a launcher that outlives its bound is killed with its whole
process group (its workers included), then the test fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HELPERS = Path(__file__).parent
SRC = HELPERS.parents[1] / "src"


def without_horovod_env(package_dir: Path = SRC, **extra: str) -> dict[str, str]:
    """horovod unimportable; hvdrunner imported from ``package_dir``; the deadlock watch's
    bound short (2 s); ``extra`` set too."""
    env = dict(os.environ, HVDRUNNER_DEADLOCK_S="2", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(HELPERS / "no_horovod"), str(package_dir),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    return env


def launch(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run a launcher to its end, within ``timeout`` seconds."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[:4]} did not end within {timeout} s:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 ARGS``, horovod unimportable."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           *args]  # fmt: skip
    return launch(cmd, env or without_horovod_env(), timeout)


def battery(script: str, out: Path, timeout: float, env: dict[str, str] | None = None
            ) -> dict[int, tuple[int, dict[str, str]]]:  # fmt: skip
    """Run a battery (a script in helpers/ that writes ``OUT/rank<r>.json``: each check's
    name and ``"ok"`` or what went wrong) on 2 ranks under torchrun; per rank, how many
    checks ran and those that failed."""
    proc = torchrun(str(HELPERS / script), str(out), timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = {}
    for rank in (0, 1):
        results = json.loads((out / f"rank{rank}.json").read_text())
        ran[rank] = (len(results), {name: why for name, why in results.items() if why != "ok"})
    return ran
