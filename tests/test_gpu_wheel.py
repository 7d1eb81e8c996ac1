"""The CUDA + NCCL horovod wheel (the gpu stack: torch 2.14.1's CUDA 13.0 build, built with the
registry's nvcc), on a machine with no GPU: what it is (CUDA and NCCL built in, both versions
in its cache key), and that its CPU paths give what hvdrunner's engine gives on the same
torch - a GPU wheel whose CPU paths were broken, or an engine whose arithmetic differs from
Horovod's, would fail here. The GPU paths themselves (NCCL on GPU tensors, pinning
on real GPUs) need a GPU: ``make gpu-check`` (scripts/gpu_check.sh); its CPU mode runs here.
The torch tests marked ``stacks("19", "gpu")`` run on both stacks (docs/testing.md); those
about the compiled ``horovod.torch`` run here only, the one stack that keeps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "scripts" / "install_horovod.sh"


@pytest.mark.torch
@pytest.mark.stacks("gpu")
def test_the_gpu_wheel_is_a_cuda_nccl_build_keyed_by_both_versions(tmp_path):
    import horovod.torch as hvd
    import torch
    from horovod.common.util import gloo_built, nccl_built

    assert torch.version.cuda and torch.version.cuda.startswith("13.")
    assert nccl_built() and gloo_built()  # horovod's own checks (nccl_built: NCCL's version)
    assert hvd.cuda_built() and hvd.nccl_built()  # the torch extension itself
    key = subprocess.run(["bash", str(BUILDER), "--print-key"], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable, "HVDRUNNER_HOROVOD_GPU": "nccl"}, timeout=120,
                         check=True).stdout.strip()  # fmt: skip
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())  # the NCCL torch ships
    assert f"-cuda{torch.version.cuda}-nccl{nccl}-" in key, key
    lib = Path(hvd.__file__).parent / "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libnccl.so.2" in needed  # linked against NCCL, resolved from torch's nvidia-nccl


@pytest.mark.torch
@pytest.mark.stacks("gpu")
@pytest.mark.timeout(420)
def test_the_gpu_wheels_cpu_paths_give_what_the_engine_gives(tmp_path):
    """The same job on both engines, one torch: allreduce, Horovod's recipe, fit and Keras'
    fit on PyTorch, 2 ranks. The parity the docs promise: the same losses within 1e-6."""
    results = {}
    for engine in ("horovod", "hvdrunner"):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "helpers" / "wheel_parity.py"),
             str(tmp_path / engine), engine],
            capture_output=True, text=True, timeout=200, cwd=tmp_path,
        )  # fmt: skip
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PARITY ")]
        assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
        results[engine] = json.loads(line[0][len("PARITY ") :])
    import numpy as np

    compiled, engine = results["horovod"], results["hvdrunner"]
    np.testing.assert_array_equal(engine["sum"], compiled["sum"])  # float64, same arithmetic
    np.testing.assert_array_equal(engine["avg"], compiled["avg"])
    for mine, theirs in zip(engine["recipe"], compiled["recipe"], strict=True):
        np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_allclose(engine["fit_loss"], compiled["fit_loss"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(engine["keras_fit_loss"], compiled["keras_fit_loss"], rtol=1e-6,
                               atol=0)  # fmt: skip


@pytest.mark.torch
@pytest.mark.stacks("gpu")
@pytest.mark.timeout(300)
def test_the_gpu_check_script_runs_its_steps_on_cpu_ranks(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu",
         "--epochs", "2", "--mib", "4", "--rows", "2048", "--out", str(out)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # Both PyTorch engines ran: hvdrunner's (torch.distributed) and the compiled horovod.torch.
    assert result["ranks"] == 2 and sorted(result["engines"]) == ["horovod", "hvdrunner"]
    for engine, runs in result["engines"].items():
        assert runs["allreduce"]["nccl_built"] is True, engine  # the CUDA torch and wheel have NCCL
        assert [r["correct"] for r in runs["allreduce"]["ranks"]] == [True, True], engine
        assert runs["torch_fit"]["rows_per_s"] > 0 and len(runs["torch_fit"]["epoch_s"]) == 2


def test_make_gpu_check_says_at_once_that_it_needs_a_gpu(tmp_path):
    # No nvidia-smi on PATH: a CPU machine. (bash and coreutils only.)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert time.monotonic() - start < 10
    assert proc.returncode == 2
    assert "make gpu-check needs an NVIDIA GPU, and nvidia-smi lists none" in proc.stderr
    assert "make test STACK=gpu" in proc.stderr
    fake = tmp_path / "nvidia-smi"  # installed but no device (a driver without a GPU)
    fake.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                          text=True, timeout=30, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 2 and "needs an NVIDIA GPU" in proc.stderr
