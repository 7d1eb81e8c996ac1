"""Build hvdrunner's horovod wheel once for a Databricks runtime and publish it to a volume.

The bundle's one-off job ``hvdrunner_build_horovod`` (resources/build_horovod_job.yml) runs
this on a single-node cluster of the runtime the training job uses. The training job then
attaches the published wheel as a task library: every node installs the same file, from the
volume, in seconds, with no PyPI and no compiler (Databricks' own advice: libraries, not
init scripts, install packages). Stdlib only: it runs before anything is installed.

    python build_horovod_wheel.py --src /Workspace/Users/me/.bundle/hvdrunner/dev/files \\
        --out /Volumes/<catalog>/<schema>/hvdrunner/wheels/18.x-gpu-ml-scala2.13

Then hvdrunner's own wheel is built from --src and published beside it, with a
``requirements.txt`` naming both: one ``%pip install -r`` line installs hvdrunner into a
cluster a user already has (docs/install.md).

Steps: check --src (the deployed bundle: scripts/install_horovod.sh and patches/) and --out;
with --install-build-tools add what the build needs and lacks (cmake 3.x from PyPI; on GPU
nodes nvcc and NCCL's headers, pinned to the node's CUDA and NCCL: gpu_toolchain.py); build or reuse the wheel through the one builder
(``install_horovod.sh --wheel``, which installs and checks it here); copy it to --out under a
temporary name and rename it into place (a reader never sees half a wheel; two builds of the
same key write the same bytes), with ``<wheel>.json`` beside it saying what it was built
for: the build key, the GPU architectures its CUDA kernels were compiled for (--cuda-archs,
``all`` by default in the bundle) and the framework versions it was built against. An --out
wheel whose recorded key matches is kept (seconds) unless ``--rebuild true``.
``requirements.txt`` pins the TensorFlow the wheel was built against (--requires, the pip
spec the Keras task installs; else the installed version), so ``%pip install -r`` brings
the same one. Every failure exits non-zero with the cause and the fix.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# A sibling module: the bundle deploys this folder whole, and a spark_python_task runs the
# file with its own folder first on sys.path, as `python build_horovod_wheel.py` does.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_toolchain  # noqa: E402
from check_wheel import pinned_version  # noqa: E402

DATABRICKS_PYTHON = "/databricks/python/bin/python"


class BuildError(Exception):
    """A failure the user can fix; the message says how."""


def _say(msg: str) -> None:
    print(f"==> [build_horovod_wheel {datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


def _builder(src: str) -> str:
    path = os.path.join(src, "scripts", "install_horovod.sh")
    if not os.path.isfile(path):
        raise BuildError(
            f"--src {src!r} has no scripts/install_horovod.sh: pass the deployed bundle's file "
            "path (${workspace.file_path}, e.g. /Workspace/Users/<you>/.bundle/hvdrunner/dev/files)"
        )
    return path


def _writable(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as exc:
        raise BuildError(
            f"--out {out!r} is not writable ({exc}): create the Unity Catalog volume first "
            "(CREATE VOLUME <catalog>.<schema>.<volume>) and grant WRITE VOLUME to the job's identity"
        ) from exc


def _run(cmd: list[str], env: dict[str, str], what: str) -> str:
    """Run ``cmd`` with its output streamed; the last line of output is returned."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        last = line.strip() or last
    if proc.wait() != 0:
        raise BuildError(f"{what} failed (exit {proc.returncode}): {last}")
    return last


def _install_build_tools(python: str, env: dict[str, str], gpu: str) -> dict[str, str]:
    """cmake 3.x (horovod 0.28.1's CMake files reject cmake 4), and on GPU nodes nvcc + NCCL's
    header (gpu_toolchain: Databricks' recipe, pinned to the node's CUDA and NCCL). Returns
    the environment the build runs in."""
    cmake = shutil.which("cmake", path=env["PATH"])
    major = None
    if cmake:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
        major = out.split()[2].split(".")[0] if out.startswith("cmake version") else None
    if cmake is None or major != "3":
        _say("installing cmake 3.x from PyPI (horovod 0.28.1 needs cmake >= 3.18, < 4)")
        _run([python, "-m", "pip", "install", "-q", "cmake>=3.18,<4"], env, "pip install cmake<4")
    node = gpu_toolchain.Node(env.get("HVDRUNNER_NODE_ROOT", "/"), env)
    if gpu == "none" or not gpu_toolchain.has_gpu(node):
        return env
    try:
        return gpu_toolchain.ensure(node, python, _say)
    except gpu_toolchain.ToolchainError as exc:
        raise BuildError(str(exc)) from exc


def _published(out: str, key: str) -> str | None:
    """The wheel in ``out`` recorded for ``key``, if its bytes still match the record."""
    for meta in glob.glob(os.path.join(out, "horovod-*.whl.json")):
        try:
            with open(meta) as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        wheel = meta[: -len(".json")]
        if (
            info.get("key") == key
            and os.path.isfile(wheel)
            and _sha256(wheel) == info.get("sha256")
        ):
            return wheel
    return None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _atomic_copy(src: str, dest: str) -> None:
    tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.partial-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def cuda_archs(key: str) -> list[str]:
    """The compute capabilities a build key names (``...-sm75.80.86-...`` -> 75, 80, 86);
    [] for a CPU build."""
    match = re.search(r"-sm(\d+(?:\.\d+)*)(?:-|$)", key)
    return match.group(1).split(".") if match else []


def _installed(python: str, dist: str, env: dict[str, str]) -> str | None:
    """``dist``'s version in ``python``'s environment (the one horovod is built against)."""
    code = f"import importlib.metadata as m\ntry: print(m.version({dist!r}))\nexcept m.PackageNotFoundError: pass"
    proc = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    return proc.stdout.strip() or None


def _frameworks(python: str, env: dict[str, str], requires: str | None) -> dict[str, str]:
    """The framework versions the wheel is built against; --requires must name the installed
    TensorFlow (the Keras task installs that spec: a wheel built against another fails)."""
    found = {d: v for d in ("tensorflow", "torch") if (v := _installed(python, d, env))}
    if requires:
        want = pinned_version(requires)
        if want is None:
            raise BuildError(f"--requires {requires!r} must pin one version (name==X.Y.Z)")
        if found.get("tensorflow") != want:
            raise BuildError(
                f"--requires {requires} but this interpreter has tensorflow "
                f"{found.get('tensorflow') or 'not installed'}: attach {requires} to the build "
                "task as a library (the bundle's dev and prod targets do)"
            )
    return found


def _publish(wheel: str, out: str, key: str, frameworks: dict[str, str]) -> str:
    dest = os.path.join(out, os.path.basename(wheel))
    _atomic_copy(wheel, dest)
    info = {
        "key": key,
        "sha256": _sha256(dest),
        "runtime": os.environ.get("DATABRICKS_RUNTIME_VERSION", "not Databricks"),
        "cuda_archs": cuda_archs(key),
        "frameworks": frameworks,
        "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    with tempfile.NamedTemporaryFile("w", dir=out, prefix=".meta-", delete=False) as f:
        json.dump(info, f, indent=2)
    os.replace(f.name, dest + ".json")
    return dest


def _hvdrunner_wheel(src: str, python: str, out: str, env: dict[str, str]) -> str:
    """Build hvdrunner's own wheel from ``src`` (no index needed: the runtime's setuptools)
    and publish it to ``out`` in place of older ones; returns its published path."""
    with tempfile.TemporaryDirectory() as tmp:
        _run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "--wheel-dir", tmp, src], env, "building the hvdrunner wheel")  # fmt: skip
        (wheel,) = glob.glob(os.path.join(tmp, "hvdrunner-*.whl"))
        dest = os.path.join(out, os.path.basename(wheel))
        _atomic_copy(wheel, dest)
    for old in glob.glob(os.path.join(out, "hvdrunner-*.whl")):
        if old != dest:
            os.remove(old)
    return dest


def _requirements(out: str, wheels: list[str], framework: str | None) -> str:
    """``out``/requirements.txt naming both wheels and the TensorFlow they were built against:
    what one ``%pip install -r`` installs."""
    path = os.path.join(out, "requirements.txt")
    runtime = os.environ.get("DATABRICKS_RUNTIME_VERSION", "this runtime")
    pins = [framework] if framework else []
    text = (
        f"# hvdrunner, the horovod it runs on and the TensorFlow horovod was built against, for\n"
        f"# Databricks Runtime {runtime}, by hvdrunner_build_horovod: %pip install -r {path}\n"
        + "".join(f"{line}\n" for line in [*wheels, *pins])
    )
    with tempfile.NamedTemporaryFile("w", dir=out, prefix=".req-", delete=False) as f:
        f.write(text)
    os.replace(f.name, path)
    return path


def build(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """Build or reuse the horovod wheel; returns its published path and the frameworks."""
    builder = _builder(args.src)
    _writable(args.out)
    python = args.python or (
        DATABRICKS_PYTHON if os.path.exists(DATABRICKS_PYTHON) else sys.executable
    )
    env = dict(
        os.environ, PYTHON=python, HVDRUNNER_WHEEL_CACHE=args.cache, HVDRUNNER_HOROVOD_GPU=args.gpu
    )
    # The wheel is for TensorFlow (the runtime's torch runs on hvdrunner's engine)
    env.setdefault("HVDRUNNER_HOROVOD_FRAMEWORKS", "tensorflow")
    if args.cuda_archs:
        env["HVDRUNNER_CUDA_ARCHS"] = args.cuda_archs
    # The interpreter's own bin first: a cmake installed from PyPI lands there.
    env["PATH"] = f"{os.path.dirname(python)}{os.pathsep}{env.get('PATH', '')}"
    if args.install_build_tools:
        env = _install_build_tools(python, env, args.gpu)
    frameworks = _frameworks(python, env, args.requires)
    key = _run(["bash", builder, "--print-key"], env, "the horovod builder (--print-key)")
    if args.rebuild == "false" and (wheel := _published(args.out, key)):
        _say(f"{wheel} is already built for {key}: kept (rebuild=true builds it again)")
        return wheel, frameworks
    _say(f"building or reusing {key} (cache {args.cache})")
    _run(["bash", builder, "--wheel"], env, "the horovod build")
    wheels = glob.glob(os.path.join(args.cache, key, "horovod-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"the builder left {len(wheels)} wheels in {args.cache}/{key}, expected 1")
    return _publish(wheels[0], args.out, key, frameworks), frameworks


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse the arguments, build, print the task library line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--src", required=True, help="the deployed bundle's files (${workspace.file_path})"
    )
    parser.add_argument("--out", required=True, help="volume folder for the wheel, one per runtime")
    parser.add_argument("--python", help=f"interpreter to build for (default {DATABRICKS_PYTHON})")
    parser.add_argument("--gpu", choices=("auto", "nccl", "none"), default="auto",
                        help="auto: NCCL on GPU nodes (fails if nvcc/NCCL are missing); none: CPU-only, on purpose")  # fmt: skip
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/hvdrunner/wheels"),
                        help="local wheel cache of the builder")  # fmt: skip
    parser.add_argument("--install-build-tools", action="store_true",
                        help="install cmake 3.x (PyPI) and, on GPU nodes, nvcc + NCCL headers (apt) when missing")  # fmt: skip
    parser.add_argument("--rebuild", nargs="?", const="true", default="false",
                        type=str.lower, choices=("true", "false"),
                        help="true: build even if --out has the wheel (the job's rebuild parameter)")  # fmt: skip
    parser.add_argument("--cuda-archs", help="GPU builds: all, or compute capabilities like 86,90")
    parser.add_argument("--requires", help="the TensorFlow pip spec the training task installs (pinned in requirements.txt)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        wheel, frameworks = build(args)
        python = args.python or (
            DATABRICKS_PYTHON if os.path.exists(DATABRICKS_PYTHON) else sys.executable
        )
        ours = _hvdrunner_wheel(args.src, python, args.out, dict(os.environ))
        tf = args.requires or (
            f"tensorflow=={frameworks['tensorflow']}" if "tensorflow" in frameworks else None
        )
        requirements = _requirements(args.out, [ours, wheel], tf)
    except BuildError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    _say(f"published {wheel} and {ours}")
    print(
        f"The training job installs it as a task library:\n  libraries:\n    - whl: {wheel}\n"
        f"Into a cluster you already have (a first notebook cell):\n"
        f"  %pip install -r {requirements}\n  dbutils.library.restartPython()\n"
        f"then check it in the next cell (the notebook's own environment):\n"
        f"  import hvdrunner.doctor\n  hvdrunner.doctor.check()"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
