"""The Databricks builder's GPU decisions (scripts/databricks/gpu_toolchain.py), each on a fake
node: no GPU, CUDA toolkit, NVIDIA apt repository or Databricks node exists here, so
``nvidia-smi``, ``dpkg-query``, ``apt-get``, ``apt-cache``, ``curl``, ``dpkg`` and the pip
interpreter are small programs that log their arguments and lay down what the real ones would
(``cuda-nvcc-X-Y`` puts nvcc in /usr/local/cuda-X.Y/bin, ``libnccl-dev`` puts nccl.h in
/usr/include), under a fake root. PATH holds the fakes only, so no real tool is reached.
What only a real node shows (the repository's packages install, their versions match the
runtime's libraries, the build then compiles) is named in docs/databricks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import scripts

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "databricks"
toolchain = scripts.load("databricks/gpu_toolchain")

UBUNTU_2204 = 'ID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n'
REPO_LINE = f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] https://{toolchain.REPO_HOST}/ubuntu2204/x86_64/ /\n"  # fmt: skip

FAKE = """#!{python}
import os, sys
from pathlib import Path
root, log = Path({root!r}), Path({log!r})
with log.open("a") as f:
    f.write(" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
{body}
"""
BODIES = {
    "nvidia-smi": "sys.exit(0 if {gpu} else 9)",
    "dpkg-query": "print({libnccl2!r}, end='') if {libnccl2!r} else sys.exit(1)",
    "apt-cache": "print({madison!r})",
    "curl": "Path(sys.argv[sys.argv.index('-o') + 1]).write_bytes(b'deb')",
    "dpkg": """d = root / "etc/apt/sources.list.d"; d.mkdir(parents=True, exist_ok=True)
(d / "cuda-ubuntu2204-x86_64.list").write_text({repo_line!r})""",
    "apt-get": """if not {apt_ok} and sys.argv[1] == "install":
    print("E: Unable to locate package", file=sys.stderr); sys.exit(100)
for pkg in sys.argv[1:]:
    if pkg.startswith("cuda-nvcc-"):
        ver = pkg[len("cuda-nvcc-"):].replace("-", ".")
        nvcc = root / f"usr/local/cuda-{{ver}}/bin/nvcc"
        nvcc.parent.mkdir(parents=True, exist_ok=True); nvcc.write_text("#!/bin/sh\\n"); nvcc.chmod(0o755)
    if pkg.startswith("libnccl-dev"):
        h = root / "usr/include/nccl.h"; h.parent.mkdir(parents=True, exist_ok=True); h.write_text("")""",
    "python": """if sys.argv[1] == "-c":
    p = root / "pip/nvidia"
    print(p if p.exists() else "", end=""); sys.exit(0 if p.exists() else 1)
if not {pip_ok}:
    sys.exit(1)
cu = [a for a in sys.argv if a.startswith("cuda-toolkit")]
if cu:
    nvcc = root / f"pip/nvidia/cu{{cu[0].split('==')[1].split('.')[0]}}/bin/nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True); nvcc.write_text("#!/bin/sh\\n"); nvcc.chmod(0o755)""",
}


class FakeNode:
    """A fake GPU node under tmp_path; ``calls()`` is every fake command run, in order."""

    def __init__(self, tmp_path: Path, *, cuda: str | None = "12.4", gpu: bool = True,
                 libnccl2: str = "2.21.5-1+cuda12.4", madison: str = "", repo: bool = False,
                 apt_ok: bool = True, pip_ok: bool = True, os_release: str = UBUNTU_2204) -> None:  # fmt: skip
        self.root, self.bin, self.log = tmp_path / "root", tmp_path / "bin", tmp_path / "calls.log"
        self.bin.mkdir(parents=True)
        self.log.write_text("")
        values = dict(gpu=gpu, libnccl2=libnccl2, madison=madison, apt_ok=apt_ok,
                      pip_ok=pip_ok, repo_line=REPO_LINE)  # fmt: skip
        for name, body in BODIES.items():
            path = self.bin / name
            path.write_text(FAKE.format(python=sys.executable, root=str(self.root),
                                        log=str(self.log), body=body.format(**values)))  # fmt: skip
            path.chmod(0o755)
        (self.root / "etc" / "apt").mkdir(parents=True)
        (self.root / "etc" / "os-release").write_text(os_release)
        if repo:
            (self.root / "etc" / "apt" / "sources.list").write_text(REPO_LINE)
        if cuda:
            folder = self.root / "usr" / "local" / f"cuda-{cuda}"
            folder.mkdir(parents=True)
            (self.root / "usr" / "local" / "cuda").symlink_to(folder)
            (folder / "version.json").write_text(json.dumps({"cuda": {"version": f"{cuda}.1"}}))

    def node(self, **env: str):
        return toolchain.Node(str(self.root), {"PATH": str(self.bin), **env})

    def add(self, relative: str, executable: bool = False) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        if executable:
            path.chmod(0o755)
        return path

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def ensure(self, **env: str) -> dict[str, str]:
        said: list[str] = []
        out = toolchain.ensure(self.node(**env), str(self.bin / "python"), said.append)
        self.said = said
        return out


def test_nvcc_installed_off_path_is_put_on_path_and_nothing_is_installed(tmp_path):
    fake = FakeNode(tmp_path)
    fake.add("usr/local/cuda-12.4/bin/nvcc", executable=True)
    fake.add("usr/include/nccl.h")
    env = fake.ensure()
    assert env["PATH"].split(os.pathsep)[0] == str(fake.root / "usr/local/cuda-12.4/bin")
    assert not [c for c in fake.calls() if c.startswith(("apt-get", "curl", "python"))]


def test_nvcc_on_path_does_not_skip_the_nccl_check_and_libnccl_dev_is_pinned(tmp_path):
    fake = FakeNode(tmp_path, repo=True)
    (fake.bin / "nvcc").write_text("#!/bin/sh\n")
    (fake.bin / "nvcc").chmod(0o755)
    fake.ensure()
    installs = [c for c in fake.calls() if c.startswith("apt-get install")]
    # The runtime's libnccl2 2.21.5 stays: the header of the same build, no cuda-nvcc.
    assert installs == [
        "apt-get install -y -q --allow-change-held-packages libnccl-dev=2.21.5-1+cuda12.4"
    ]
    assert not [c for c in fake.calls() if c.startswith("curl")]  # the repository was there


def test_a_node_without_nvidias_repository_gets_it_for_its_ubuntu_then_pinned_packages(tmp_path):
    fake = FakeNode(tmp_path)
    env = fake.ensure()
    calls = fake.calls()
    fetch = next(c for c in calls if c.startswith("curl"))
    assert fetch.endswith(
        f"https://{toolchain.REPO_HOST}/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb"
    )
    order = [
        c.split()[0] + " " + c.split()[1]
        for c in calls
        if c.split()[0] in ("curl", "dpkg", "apt-get")
    ]
    assert order == ["curl -fsSL", "dpkg -i", "apt-get update", "apt-get install"]
    assert calls[-1].endswith("cuda-nvcc-12-4 libnccl-dev=2.21.5-1+cuda12.4")
    # cuda-nvcc-12-4 puts nvcc in /usr/local/cuda-12.4/bin, which is not on PATH: now it is.
    assert env["PATH"].split(os.pathsep)[0] == str(fake.root / "usr/local/cuda-12.4/bin")
    assert any("putting" in s and "on PATH" in s for s in fake.said)


def test_without_libnccl2_the_newest_nccl_built_for_the_nodes_cuda_is_taken(tmp_path):
    madison = "\n".join(f"libnccl-dev | {v} | https://developer.download.nvidia.com ..." for v in
                        ("2.23.4-1+cuda12.6", "2.22.3-1+cuda12.4", "2.21.5-1+cuda12.4"))  # fmt: skip
    fake = FakeNode(tmp_path, libnccl2="", madison=madison, repo=True)
    fake.add("usr/local/cuda-12.4/bin/nvcc", executable=True)
    fake.ensure()
    assert fake.calls()[-1].endswith("libnccl2=2.22.3-1+cuda12.4 libnccl-dev=2.22.3-1+cuda12.4")


def test_the_cuda_version_comes_from_version_json_else_the_newest_folder(tmp_path):
    fake = FakeNode(tmp_path, cuda="12.4")
    assert toolchain.cuda_version(fake.node()) == "12.4"
    other = FakeNode(tmp_path / "b", cuda=None)
    for v in ("11.8", "12.10", "12.2"):
        (other.root / "usr" / "local" / f"cuda-{v}").mkdir(parents=True)
    assert toolchain.cuda_version(other.node()) == "12.10"
    bare = FakeNode(tmp_path / "c", cuda=None)
    with pytest.raises(toolchain.ToolchainError, match="cannot tell this GPU node's CUDA version"):
        bare.ensure()


def test_apt_failing_on_cuda_13_falls_back_to_the_registrys_compiler(tmp_path):
    fake = FakeNode(tmp_path, cuda="13.0", libnccl2="2.28.3-1+cuda13.0", apt_ok=False, repo=True)
    env = fake.ensure()
    pip = [c for c in fake.calls() if c.startswith("python -m pip")]
    assert pip == [
        "python -m pip install -q cuda-toolkit[nvcc,cccl]==13.0.* nvidia-nccl-cu13==2.28.3"
    ]
    assert env["PATH"].split(os.pathsep)[0] == str(fake.root / "pip/nvidia/cu13/bin")


def test_apt_failing_on_cuda_12_fails_naming_both_causes_and_the_cpu_choice(tmp_path):
    fake = FakeNode(tmp_path, apt_ok=False, repo=True)
    with pytest.raises(toolchain.ToolchainError) as err:
        fake.ensure()
    message = str(err.value)
    assert message.startswith("a GPU build needs nvcc and nccl.h for CUDA 12.4")
    assert "apt: apt-get install" in message and "Unable to locate package" in message
    assert "PyPI has no nvcc for CUDA 12.4" in message and "--gpu none" in message


def test_a_node_that_is_not_ubuntu_is_told_what_to_do(tmp_path):
    fake = FakeNode(tmp_path, os_release='ID=rhel\nVERSION_ID="9"\nPRETTY_NAME="RHEL 9"\n',
                    pip_ok=False)  # fmt: skip
    with pytest.raises(
        toolchain.ToolchainError, match="added for Ubuntu nodes; this one is RHEL 9"
    ):
        fake.ensure()


def test_the_build_job_skips_the_toolchain_on_a_node_without_gpus_and_reports_its_errors(tmp_path):
    """Through build_horovod_wheel.py itself: the node root and PATH are the fake node's."""
    job = SCRIPTS / "build_horovod_wheel.py"
    for gpu, expect in ((False, None), (True, "PyPI has no nvcc for CUDA 12.4")):
        fake = FakeNode(tmp_path / str(gpu), gpu=gpu, apt_ok=False, repo=True)
        (fake.bin / "cmake").write_text("#!/bin/sh\necho 'cmake version 3.31.6'\n")
        (fake.bin / "cmake").chmod(0o755)
        env = {"PATH": f"{fake.bin}:/usr/bin:/bin", "HVDRUNNER_NODE_ROOT": str(fake.root),
               "HOME": str(tmp_path)}  # fmt: skip
        proc = subprocess.run(
            [sys.executable, str(job), "--src", str(ROOT), "--out", str(tmp_path / "out"),
             "--python", str(fake.bin / "python"), "--install-build-tools", "--gpu", "auto"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 1
        calls = fake.calls()
        assert calls[0] == "nvidia-smi -L", calls
        if expect is None:  # no GPU: no toolchain step, straight on to the builder (which
            # fails here: the fake interpreter has no framework)
            assert not [c for c in calls if c.startswith(("apt-get", "curl", "dpkg "))], calls
            assert "neither TensorFlow nor PyTorch is installed" in proc.stderr
        else:
            assert "ERROR: a GPU build needs nvcc and nccl.h for CUDA 12.4" in proc.stderr
            assert expect in proc.stderr
