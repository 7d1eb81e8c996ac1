"""The horovod builder, run for real against this stack's venv (the cached wheel makes it
fast). GPU nodes are faked (nvidia-smi, nvcc and NCCL stand-ins on PATH): no GPU here. The
Databricks wheel job: tests/test_databricks_wheel.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdrunner.keras import compat

ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "scripts" / "install_horovod.sh"


def _run(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env},
    )  # fmt: skip


def test_cache_key_names_everything_the_binary_depends_on(tmp_path):
    import importlib.metadata as md

    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path)}
    # what the stacks build: TensorFlow only (18's torch runs on hvdrunner's engine)
    proc = _run(BUILDER, env | {"HVDRUNNER_HOROVOD_FRAMEWORKS": "tensorflow"}, "--print-key")
    assert proc.returncode == 0, proc.stderr
    key = proc.stdout.strip()
    tf = md.version("tensorflow")
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    assert key.startswith(f"horovod-0.28.1-tf{tf}-{py}-cpu-gloo-nompi")
    # by default, every framework installed gets its extension: torch too where it is here
    every = _run(BUILDER, env, "--print-key").stdout.strip()
    torch = _installed_version("torch")
    assert (f"-torch{torch}-" in every) if torch else every == key
    # the TF >= 2.16 patch is part of the key (a patched build is a different binary)
    assert ("-noxla-" in key) == (compat.generation() == 3 or tf >= "2.16")


def _installed_version(name: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(name).replace("+", "")
    except md.PackageNotFoundError:
        return None


def test_builder_with_horovod_in_place_only_checks(tmp_path):
    proc = _run(BUILDER, {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path),
                          "HVDRUNNER_HOROVOD_FRAMEWORKS": "tensorflow"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already installed with TensorFlow, gloo and hvdrunner's patches" in proc.stdout
    # TensorFlow's C++ start-up lines (cuDNN factories and the like) are not news here.
    banners = [ln for ln in (proc.stdout + proc.stderr).splitlines()
               if "external/local_xla" in ln or "Unable to register" in ln or "cpu_feature_guard" in ln]  # fmt: skip
    assert not banners, banners


def test_cache_key_carries_a_digest_of_the_patches(tmp_path):
    # A copy of the builder with one patch edited must not reuse the original's wheels.
    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c")}
    key = _run(BUILDER, env, "--print-key").stdout.strip()
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(ROOT / "patches", copy / "patches")
    patch = copy / "patches" / "horovod-0.28.1-gloo-process-set-iface.patch"
    patch.write_text(patch.read_text().replace("global_context.gloo_iface_;", "std::string();"))
    edited = _run(copy / "scripts" / "install_horovod.sh", env, "--print-key").stdout.strip()
    assert re.search(r"-p[0-9a-f]{10}-", key) and edited != key
    assert edited.split("-p")[0] == key.split("-p")[0]  # only the digest differs


def test_an_installed_horovod_without_the_iface_patch_is_replaced_or_kept_loudly(tmp_path):
    # As on DBR 15.4 LTS ML: horovod 0.28.1 works but lacks the patch (its marker module).
    from helpers.unpatched_horovod import marker_hidden

    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path),
           "HVDRUNNER_KEEP_INSTALLED_HOROVOD": "1",
           "HVDRUNNER_HOROVOD_FRAMEWORKS": "tensorflow"}  # fmt: skip
    with marker_hidden():
        kept = _run(BUILDER, env)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "WARNING: keeping the installed horovod 0.28.1, which lacks" in kept.stdout
    assert "hvdrunner checks before hvd.init()" in kept.stdout


def test_builder_fails_loudly_without_a_framework(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = _run(BUILDER, {"PYTHON": str(venv / "bin" / "python"),
                          "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c")})  # fmt: skip
    assert proc.returncode != 0
    assert "neither TensorFlow nor PyTorch is installed" in proc.stderr


def test_patch_applies_to_the_horovod_sdist_cmake_line():
    patch = (ROOT / "patches" / "horovod-0.28.1-no-xla-mpi-ops.patch").read_text()
    assert (
        '-list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")'
        in patch
    )
    assert "+++ b/horovod/tensorflow/CMakeLists.txt" in patch


@pytest.mark.parametrize("mode", ["bogus"])
def test_builder_refuses_an_unknown_gpu_mode(tmp_path, mode):
    proc = _run(BUILDER, {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path),
                          "HVDRUNNER_HOROVOD_GPU": mode}, "--print-key")  # fmt: skip
    assert proc.returncode != 0 and "must be none, nccl or auto" in proc.stderr


#: What nvcc 12.4's --list-gpu-arch prints (one per line).
NVCC_ARCHS = "\n".join(
    f"compute_{cc}" for cc in (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90)
)


def _fake_gpu_node(tmp_path: Path, nvcc: bool, gpu: str | None = "8.6") -> dict[str, str]:
    """PATH with a fake nvidia-smi that sees one GPU of compute capability ``gpu`` (none when
    None), and a fake nvcc 12.4 if asked."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    tools = {}
    if gpu is not None:
        tools["nvidia-smi"] = (
            f'case "$*" in *compute_cap*) echo "{gpu}" ;; '
            f"*) echo 'GPU 0: NVIDIA A10G (UUID: GPU-fake)' ;; esac"
        )
    if nvcc:
        tools["nvcc"] = (
            f'case "$*" in *--list-gpu-arch*) printf "{NVCC_ARCHS}\\n" ;; '
            f"*) echo 'Cuda compilation tools, release 12.4, V12.4.131' ;; esac"
        )
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HVDRUNNER_NCCL_SEARCH": str(tmp_path / "none")}


def _fake_nccl(tmp_path: Path) -> Path:
    home = tmp_path / "nccl"
    (home / "include").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 21\n")
    (home / "lib" / "libnccl.so.2").write_bytes(b"")
    return home


def test_a_gpu_node_without_nvcc_fails_naming_the_fix_instead_of_building_cpu_only(tmp_path):
    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c"),
           "HVDRUNNER_HOROVOD_GPU": "auto", **_fake_gpu_node(tmp_path, nvcc=False)}  # fmt: skip
    proc = _run(BUILDER, env, "--print-key")
    assert proc.returncode != 0
    assert "needs nvcc on PATH" in proc.stderr
    assert "cuda-nvcc" in proc.stderr and "HVDRUNNER_HOROVOD_GPU=none" in proc.stderr


def test_a_gpu_build_finds_nccl_or_says_where_it_looked(tmp_path):
    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c"),
           "HVDRUNNER_HOROVOD_GPU": "auto", **_fake_gpu_node(tmp_path, nvcc=True)}  # fmt: skip
    missing = _run(BUILDER, env, "--print-key")
    assert missing.returncode != 0
    assert "needs nccl.h and libnccl.so" in missing.stderr and "libnccl-dev" in missing.stderr
    found = _run(BUILDER, {**env, "HOROVOD_NCCL_HOME": str(_fake_nccl(tmp_path))}, "--print-key")
    assert found.returncode == 0, found.stderr
    assert "-cuda12.4-nccl2.21-sm86-gloo-nompi" in found.stdout.strip()
    assert "CUDA architectures: 86 (this node's GPUs, nvidia-smi)" in found.stderr


@pytest.mark.parametrize("archs,key,said", [
    (None, "-sm86-", "this node's GPUs"),
    ("8.0, 9.0", "-sm80.90-", "(HVDRUNNER_CUDA_ARCHS)"),
    ("all", "-sm50.52.53.60.61.62.70.72.75.80.86.87.89.90-", "every one nvcc knows"),
])  # fmt: skip
def test_a_gpu_build_compiles_for_the_architectures_it_needs_and_its_key_names_them(
    tmp_path, archs, key, said
):
    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c"),
           "HVDRUNNER_HOROVOD_GPU": "nccl", "HOROVOD_NCCL_HOME": str(_fake_nccl(tmp_path)),
           **_fake_gpu_node(tmp_path, nvcc=True)}  # fmt: skip
    if archs is not None:
        env["HVDRUNNER_CUDA_ARCHS"] = archs
    proc = _run(BUILDER, env, "--print-key")
    assert proc.returncode == 0, proc.stderr
    assert key in proc.stdout.strip() and said in proc.stderr


def test_without_a_gpu_the_build_takes_nvccs_oldest_architecture_as_ptx(tmp_path):
    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c"),
           "HVDRUNNER_HOROVOD_GPU": "nccl", "HOROVOD_NCCL_HOME": str(_fake_nccl(tmp_path)),
           **_fake_gpu_node(tmp_path, nvcc=True, gpu=None)}  # fmt: skip
    proc = _run(BUILDER, env, "--print-key")
    assert proc.returncode == 0, proc.stderr
    assert "-sm50-" in proc.stdout and "no GPU on this node: nvcc's oldest" in proc.stderr


def test_an_architecture_nvcc_cannot_build_is_refused_naming_the_ones_it_can(tmp_path):
    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c"),
           "HVDRUNNER_HOROVOD_GPU": "nccl", "HOROVOD_NCCL_HOME": str(_fake_nccl(tmp_path)),
           "HVDRUNNER_CUDA_ARCHS": "100", **_fake_gpu_node(tmp_path, nvcc=True)}  # fmt: skip
    proc = _run(BUILDER, env, "--print-key")
    assert proc.returncode != 0
    assert "cannot compile for compute capability 100 (it knows: 50 52" in proc.stderr
    bad = _run(BUILDER, {**env, "HVDRUNNER_CUDA_ARCHS": "sm_90"}, "--print-key")
    assert (
        bad.returncode != 0 and "HVDRUNNER_CUDA_ARCHS must list compute capabilities" in bad.stderr
    )


def test_a_cpu_only_build_on_a_gpu_node_is_an_explicit_loud_choice(tmp_path):
    env = {"PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path / "c"),
           "HVDRUNNER_HOROVOD_GPU": "none", **_fake_gpu_node(tmp_path, nvcc=False)}  # fmt: skip
    proc = _run(BUILDER, env, "--print-key")
    assert proc.returncode == 0, proc.stderr
    key = proc.stdout.strip().splitlines()[-1]
    assert "-cpu-gloo-nompi" in key
    assert "WARNING: this node has GPUs but HVDRUNNER_HOROVOD_GPU=none" in proc.stdout
