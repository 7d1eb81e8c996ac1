"""First task of each training job: is the horovod wheel its tasks install there, and built for
this runtime, the TensorFlow the Keras task installs and this node's GPU? Fails in seconds, naming the job that builds it, instead of a library install
that fails on a missing Volume file with no hint (or a wheel for another Python that pip
refuses). Stdlib only: it runs before any library is installed.

    python check_wheel.py --wheel /Volumes/c/s/hvdrunner/wheels/18.x-gpu-ml-scala2.13/horovod-0.28.1-cp312-cp312-linux_x86_64.whl \\
        --build-job "databricks bundle run -t dev --var catalog=c --var schema=s hvdrunner_build_horovod"

The bundle names the wheel from ``python_tag`` and ``spark_version``; :data:`RUNTIME_PYTHON`
says which tag each runtime's Python has (tests/test_bundle.py holds every target's defaults
to it), and this check holds the tag to the interpreter that really runs here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

#: Databricks Runtime (ML) line -> its CPython tag (the runtimes' release notes, "System
#: environment"). A line not here is checked against the running interpreter alone.
RUNTIME_PYTHON = {"15.4": "cp311", "16.4": "cp312", "17.3": "cp312", "18": "cp312"}
WHEEL = re.compile(r"horovod-(?P<version>[^-]+)-(?P<tag>cp\d+)-(?P=tag)-linux_(?P<arch>\w+)\.whl")


def runtime_line(spark_version: str) -> str:
    """``18.x-gpu-ml-scala2.13`` -> ``18``; ``15.4.x-gpu-ml-scala2.12`` -> ``15.4``."""
    match = re.match(r"(\d+(?:\.\d+)?)\.x-", spark_version)
    if not match:
        raise ValueError(f"{spark_version!r} is not a runtime key like 18.x-gpu-ml-scala2.13")
    return match.group(1)


def _record(wheel: str) -> dict:
    """What the build job wrote beside the wheel (``<wheel>.json``); {} if none."""
    try:
        with open(wheel + ".json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def node_gpus() -> list[str]:
    """This node's GPUs' compute capabilities (``86``, ``90``); [] without a GPU or nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({line.strip().replace(".", "") for line in out.splitlines() if line.strip()})


def pinned_version(spec: str) -> str | None:
    """``tensorflow[and-cuda]==2.21.0`` -> ``2.21.0``; None without an exact pin (the build
    job, build_horovod_wheel.py, reads pins with this too)."""
    match = re.fullmatch(r"\s*[A-Za-z0-9_.-]+(?:\[[^]]*\])?\s*==\s*([^\s;,]+)\s*", spec)
    return match.group(1) if match else None


def _fit(record: dict, rebuild: str, deploy: str, runtime: str | None, requires: str | None,
         gpus: list[str]) -> list[str]:  # fmt: skip
    """What the build record says does not fit this cluster."""
    found = []
    built_on = record.get("runtime")
    if runtime and built_on and built_on not in (runtime, "not Databricks"):
        found.append(f"it was built on runtime {built_on}, this cluster runs {runtime}: rebuild "
                     f"with `{rebuild}` or point spark_version at {built_on}")  # fmt: skip
    want, built = (pinned_version(requires) if requires else None), record.get("frameworks", {})
    if want and "tensorflow" in built and built["tensorflow"] != want:
        found.append(f"it was built against tensorflow {built['tensorflow']}, the Keras task "
                     f"installs {requires}: rebuild with `{rebuild}`")  # fmt: skip
    archs = [int(a) for a in record.get("cuda_archs") or []]
    # An older GPU cannot run kernels compiled for a newer one; a newer GPU JIT-compiles the
    # oldest architecture's PTX (slower first start, but it runs).
    old = [g for g in gpus if archs and int(g) < min(archs)]
    if old:
        found.append(f"its CUDA kernels were compiled for compute capability "
                     f"{','.join(map(str, archs))} and this node's GPU is {','.join(old)}: "
                     f"deploy with `{deploy} --var cuda_archs=all` and rebuild with "
                     f"`{rebuild}`")  # fmt: skip
    return found


def problems(wheel: str, build_job: str, tag: str, runtime: str | None,
             requires: str | None = None, gpus: list[str] | None = None) -> list[str]:  # fmt: skip
    """What is wrong with ``wheel`` for an interpreter of ``tag`` on ``runtime`` (the Keras task
    installing ``requires``, this node having ``gpus``); [] if fine."""
    rebuild = f"{build_job} --params rebuild=true"  # the build job's job parameter
    # The same command's deploy: `databricks bundle run -t T --var ... <job>` without the job.
    deploy = build_job.rsplit(" ", 1)[0].replace("bundle run", "bundle deploy", 1)
    match = WHEEL.fullmatch(os.path.basename(wheel))
    if match is None:
        return [
            f"{wheel!r} is not a horovod wheel name (horovod-<version>-cpXY-cpXY-linux_<arch>.whl)"
        ]
    if match.group("tag") != tag:
        return [
            f"the wheel is for {match.group('tag')} but this runtime's Python is {tag}: deploy with "
            f"`{deploy} --var python_tag={tag}` (and build it: `{build_job}`)"
        ]
    if not os.path.isfile(wheel):
        return [
            f"no horovod wheel at {wheel}: build it once for this runtime with `{build_job}`, "
            "then run this job again"
        ]
    return [
        f"{wheel}: {p}"
        for p in _fit(_record(wheel), rebuild, deploy, runtime, requires, gpus or [])
    ]


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 0 when the wheel is there and fits; 1 naming what to do otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", required=True, help="the wheel the training tasks install")
    parser.add_argument("--build-job", required=True, help="the command that builds it")
    parser.add_argument("--requires", help="the TensorFlow pip spec the Keras task installs")
    args = parser.parse_args(argv)
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    runtime = os.environ.get("DATABRICKS_RUNTIME_VERSION")
    found = problems(args.wheel, args.build_job, tag, runtime, args.requires, node_gpus())
    for problem in found:
        print(f"ERROR: {problem}", file=sys.stderr, flush=True)
    if not found:
        print(f"horovod wheel ready for {tag}: {args.wheel}", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
