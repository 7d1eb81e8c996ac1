"""What a GPU build of horovod needs on a Databricks GPU node, found or installed.

Databricks' "Install a different version of Horovod" page is the recipe: add NVIDIA's CUDA apt
repository, then ``apt-get install`` the CUDA compiler and the NCCL headers *pinned to the
versions the node already runs*. This module follows it, one decision at a time, and each
decision is a function a test drives on a fake node (fake ``nvidia-smi``, ``apt-get``,
``dpkg-query``, ``curl``, ``/usr/local/cuda*``, ``/etc/os-release`` under a fake root):

1. the node's CUDA version: ``/usr/local/cuda/version.json``, else the newest
   ``/usr/local/cuda-X.Y`` folder (what the runtime's CUDA libraries came with);
2. ``nvcc``: on PATH, else in ``/usr/local/cuda-X.Y/bin`` (where ``cuda-nvcc-X-Y`` puts it,
   and which is not on PATH), else installed: apt ``cuda-nvcc-X-Y`` from NVIDIA's repository
   (added for the node's Ubuntu release when missing), else, for CUDA >= 13, the registry's
   ``cuda-toolkit[nvcc,cccl]==X.Y.*`` (CUDA 12's ``nvidia-cuda-nvcc-cu12`` ships no nvcc);
3. NCCL's header, checked always (a node can have nvcc and no ``nccl.h``): apt ``libnccl-dev``
   pinned to the installed ``libnccl2`` (or, with none, the newest ``+cudaX.Y`` build), else
   the registry's ``nvidia-nccl-cuXX`` at the node's NCCL version.

Stdlib only (it runs before anything is installed). ``install_horovod.sh`` then finds what
was put in place: nvcc on the PATH this returns, NCCL in /usr or the pip package (it adds the
unversioned ``libnccl.so`` that horovod's FindNCCL.cmake looks for).
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

REPO_HOST = "developer.download.nvidia.com/compute/cuda/repos"
KEYRING = "cuda-keyring_1.1-1_all.deb"


class ToolchainError(Exception):
    """A missing piece the user can fix; the message says how."""


Say = Callable[[str], None]


@dataclass(frozen=True)
class Node:
    """Where to look: ``root`` prefixes every file path (``/`` on a real node), ``env`` holds
    PATH (commands are looked up there) and the rest of the environment."""

    root: str
    env: dict[str, str]

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *(p.lstrip("/") for p in parts))

    def which(self, command: str) -> str | None:
        return shutil.which(command, path=self.env.get("PATH", ""))

    def run(self, cmd: list[str], what: str) -> str:
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            raise ToolchainError(f"{what} failed (exit {proc.returncode}): {' / '.join(tail)}")
        return proc.stdout

    def with_path_first(self, folder: str) -> Node:
        return Node(self.root, {**self.env, "PATH": f"{folder}{os.pathsep}{self.env['PATH']}"})


def has_gpu(node: Node) -> bool:
    """True when ``nvidia-smi -L`` lists a GPU."""
    smi = node.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def cuda_version(node: Node) -> str | None:
    """The node's CUDA as ``major.minor``: version.json, else the newest cuda-X.Y folder."""
    try:
        with open(node.path("/usr/local/cuda/version.json")) as f:
            return ".".join(json.load(f)["cuda"]["version"].split(".")[:2])
    except (OSError, KeyError, ValueError):
        pass
    found = [m.group(1) for d in glob.glob(node.path("/usr/local/cuda-*"))
             if (m := re.fullmatch(r"cuda-(\d+\.\d+)", os.path.basename(d)))]  # fmt: skip
    return max(found, key=lambda v: tuple(map(int, v.split(".")))) if found else None


def find_nvcc(node: Node, cuda: str) -> str | None:
    """nvcc on PATH, else where the apt packages put it (off PATH)."""
    on_path = node.which("nvcc")
    if on_path:
        return on_path
    for folder in (f"/usr/local/cuda-{cuda}/bin", "/usr/local/cuda/bin"):
        candidate = node.path(folder, "nvcc")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_nccl_header(node: Node, cuda: str) -> str | None:
    """The folder holding nccl.h, where install_horovod.sh looks for it too."""
    homes = [node.env.get("HOROVOD_NCCL_HOME", "")]
    homes += [node.path(p) for p in ("/usr", f"/usr/local/cuda-{cuda}", "/usr/local/cuda")]
    for home in filter(None, homes):
        if os.path.isfile(os.path.join(home, "include", "nccl.h")):
            return os.path.join(home, "include")
    return None


def installed_nccl(node: Node) -> str | None:
    """The apt version of the runtime's libnccl2 (e.g. ``2.21.5-1+cuda12.4``), if any."""
    dpkg = node.which("dpkg-query")
    if dpkg is None:
        return None
    proc = subprocess.run([dpkg, "-W", "-f=${Version}", "libnccl2"], env=node.env,
                          capture_output=True, text=True)  # fmt: skip
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def ubuntu_repo(node: Node) -> str:
    """NVIDIA's repository folder for this node, e.g. ``ubuntu2204/x86_64``."""
    fields: dict[str, str] = {}
    try:
        with open(node.path("/etc/os-release")) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                fields[key] = value.strip('"')
    except OSError as exc:
        raise ToolchainError(
            f"cannot read /etc/os-release to pick NVIDIA's apt repository: {exc}"
        ) from exc
    if fields.get("ID") != "ubuntu" or not fields.get("VERSION_ID"):
        raise ToolchainError(
            f"NVIDIA's CUDA apt repository is added for Ubuntu nodes; this one is {fields.get('PRETTY_NAME', 'unknown')}: "
            "install nvcc and NCCL's headers yourself (or pass --gpu none for a CPU-only build)"
        )
    arch = {"x86_64": "x86_64", "aarch64": "sbsa"}.get(
        node.env.get("HVDRUNNER_NODE_ARCH", platform.machine()), "x86_64"
    )
    return f"ubuntu{fields['VERSION_ID'].replace('.', '')}/{arch}"


def has_cuda_repo(node: Node) -> bool:
    """True when an apt source already points at NVIDIA's CUDA repository."""
    sources = [
        node.path("/etc/apt/sources.list"),
        *glob.glob(node.path("/etc/apt/sources.list.d/*")),
    ]
    for source in sources:
        try:
            with open(source, errors="replace") as f:
                if REPO_HOST in f.read():
                    return True
        except OSError:
            continue
    return False


def add_cuda_repo(node: Node, say: Say) -> None:
    """Databricks' recipe, step 1: NVIDIA's keyring package, which adds the repository."""
    repo = ubuntu_repo(node)
    url = f"https://{REPO_HOST}/{repo}/{KEYRING}"
    curl = node.which("curl")
    if curl is None:
        raise ToolchainError(f"curl is needed to fetch {url} (NVIDIA's CUDA apt repository key)")
    say(f"adding NVIDIA's CUDA apt repository ({repo})")
    with tempfile.TemporaryDirectory() as tmp:
        deb = os.path.join(tmp, KEYRING)
        node.run([curl, "-fsSL", "-o", deb, url], f"downloading {url}")
        node.run(["dpkg", "-i", deb], f"dpkg -i {KEYRING}")


def nccl_dev_package(node: Node, cuda: str) -> list[str]:
    """libnccl-dev pinned to the libnccl2 the node runs (never an upgrade of the runtime's
    NCCL); with none installed, the newest build for this CUDA from ``apt-cache madison``."""
    version = installed_nccl(node)
    if version:
        return [f"libnccl-dev={version}"]
    madison = node.run(["apt-cache", "madison", "libnccl-dev"], "apt-cache madison libnccl-dev")
    builds = [line.split("|")[1].strip() for line in madison.splitlines() if "|" in line]
    matching = [v for v in builds if v.endswith(f"+cuda{cuda}")]
    if not matching:
        raise ToolchainError(
            f"NVIDIA's apt repository has no libnccl-dev built for CUDA {cuda} (apt-cache madison libnccl-dev)"
        )
    return [f"libnccl2={matching[0]}", f"libnccl-dev={matching[0]}"]


def apt_install(node: Node, cuda: str, need_nvcc: bool, need_nccl: bool, say: Say) -> None:
    """Databricks' recipe, step 2: the pinned packages from NVIDIA's repository."""
    if node.which("apt-get") is None:
        raise ToolchainError("this node has no apt-get")
    if not has_cuda_repo(node):
        add_cuda_repo(node, say)
    node.run(["apt-get", "update", "-q"], "apt-get update")
    packages = [f"cuda-nvcc-{cuda.replace('.', '-')}"] if need_nvcc else []
    packages += nccl_dev_package(node, cuda) if need_nccl else []
    say(f"apt-get install {' '.join(packages)}")
    node.run(["apt-get", "install", "-y", "-q", "--allow-change-held-packages", *packages],
             f"apt-get install {' '.join(packages)}")  # fmt: skip


def pip_install(
    node: Node, python: str, cuda: str, need_nvcc: bool, need_nccl: bool, say: Say
) -> None:
    """The registry's CUDA pieces: nvcc exists there for CUDA >= 13 only."""
    major = int(cuda.split(".")[0])
    packages = []
    if need_nvcc:
        if major < 13:
            raise ToolchainError(
                f"PyPI has no nvcc for CUDA {cuda} (nvidia-cuda-nvcc-cu12 ships only ptxas)"
            )
        packages.append(f"cuda-toolkit[nvcc,cccl]=={cuda}.*")
    if need_nccl:
        version = (installed_nccl(node) or "").split("-")[0]
        packages.append(f"nvidia-nccl-cu{major}" + (f"=={version}" if version else ""))
    say(f"pip install {' '.join(packages)} (the registry's CUDA {cuda} toolchain)")
    node.run([python, "-m", "pip", "install", "-q", *packages], f"pip install {' '.join(packages)}")


def pip_nvcc(python: str, cuda: str) -> str | None:
    """nvcc from the registry's wheels in ``python``'s environment (nvidia/cuXX/bin)."""
    code = "import nvidia, os; print(os.pathsep.join(nvidia.__path__))"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    for base in proc.stdout.strip().split(os.pathsep) if proc.returncode == 0 else []:
        candidate = os.path.join(base, f"cu{cuda.split('.')[0]}", "bin", "nvcc")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure(node: Node, python: str, say: Say) -> dict[str, str]:
    """Make nvcc and NCCL's header available; returns the environment the build runs in
    (PATH with nvcc's folder first). Raises ToolchainError naming what is missing."""
    cuda = cuda_version(node)
    if cuda is None:
        raise ToolchainError(
            "cannot tell this GPU node's CUDA version (no /usr/local/cuda/version.json or /usr/local/cuda-X.Y)"
        )
    nvcc, header = find_nvcc(node, cuda), find_nccl_header(node, cuda)
    if nvcc is None or header is None:
        missing = " and ".join(n for n, p in (("nvcc", nvcc), ("nccl.h", header)) if p is None)
        say(f"CUDA {cuda} node without {missing}: installing them (Databricks' Horovod recipe)")
        try:
            apt_install(node, cuda, nvcc is None, header is None, say)
        except ToolchainError as apt_error:
            say(f"apt did not provide them ({apt_error}); trying the package registry")
            try:
                pip_install(node, python, cuda, nvcc is None, header is None, say)
            except ToolchainError as pip_error:
                raise ToolchainError(
                    f"a GPU build needs {missing} for CUDA {cuda}: apt: {apt_error}; PyPI: {pip_error}. "
                    "Install them on the node, or pass --gpu none for a CPU-only build"
                ) from pip_error
        nvcc = find_nvcc(node, cuda) or pip_nvcc(python, cuda)
        if nvcc is None:
            raise ToolchainError(
                f"nvcc for CUDA {cuda} is still missing after the install (see above)"
            )
    if os.path.dirname(nvcc) not in node.env["PATH"].split(os.pathsep):
        say(f"putting {os.path.dirname(nvcc)} on PATH (the CUDA packages install nvcc off PATH)")
        node = node.with_path_first(os.path.dirname(nvcc))
    return node.env
