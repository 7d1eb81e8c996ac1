"""Where CI's CPU goes: each test's CPU-seconds, every process it started included (ranks,
JVMs, notebooks' and the stand-in's subprocesses), summed per stage and per module.

CI is CPU-bound (two cores busy 97 % of a run), so its time is its work: a stage's wall
clock says little when other stages run beside it; its CPU-seconds do not change with them.

    python benchmarks/ci_cpu.py run 18                  # make test STACK=18, profiled
    python benchmarks/ci_cpu.py run 18 --tf-keras       # make test-tf-keras STACK=18
    python benchmarks/ci_cpu.py summary [FILE]          # per stage and module, top tests

``run`` puts itself (and so everything the stage starts, in any session) in a cpuacct
cgroup of its own (cgroup v1, as root), then runs the stage with this module as a pytest
plugin (``-p benchmarks.ci_cpu``): before and after each test it reads the cgroup's
``cpuacct.usage`` and appends one JSON line to ``HVDRUNNER_CPU_PROFILE`` (default
``.hvdrunner/ci_cpu.jsonl``). Stages may run side by side, each in its own cgroup. Where no
cgroup can be made it counts the whole machine (right only with nothing else running).
``summary`` writes benchmarks/results/ci_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROFILE_ENV = "HVDRUNNER_CPU_PROFILE"
DEFAULT_OUT = ROOT / ".hvdrunner" / "ci_cpu.jsonl"
CGROUPS = Path("/sys/fs/cgroup/cpuacct")
RESULT = ROOT / "benchmarks" / "results" / "ci_cpu.json"


def _usage_file() -> Path | None:
    """This process's cpuacct usage file (cgroup v1); None where there is none."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                found = CGROUPS / path.lstrip("/") / "cpuacct.usage"
                return found if found.exists() else None
    except OSError:
        return None
    return None


def cpu_seconds() -> float:
    """CPU-seconds used so far by this process's cgroup, else by the whole machine."""
    usage = _usage_file()
    if usage is not None:
        return int(usage.read_text()) / 1e9
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """One line per test (set-up, call and teardown together): its CPU and wall seconds."""
    cpu0, wall0 = cpu_seconds(), time.time()
    yield
    line = {"id": item.nodeid, "cpu": round(cpu_seconds() - cpu0, 2),
            "wall": round(time.time() - wall0, 2), "stage": os.environ.get("HVDRUNNER_CPU_STAGE")}  # fmt: skip
    with open(os.environ.get(PROFILE_ENV, DEFAULT_OUT), "a") as f:
        f.write(json.dumps(line) + "\n")


def run(stack: str, tf_keras: bool, out: Path) -> int:
    """The stage in a cpuacct cgroup of its own; prints its CPU and wall seconds."""
    stage = f"{stack}{' tf_keras mode' if tf_keras else ''}"
    group = CGROUPS / f"hvdrunner-cpu-{stack}{'-tf_keras' if tf_keras else ''}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        print(f"no cgroup ({exc}): counting the whole machine", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | {PROFILE_ENV: str(out), "HVDRUNNER_CPU_STAGE": stage}
    target = "test-tf-keras" if tf_keras else "test"
    args = f"-p benchmarks.ci_cpu {env.get('PYTEST_ARGS', '')}".strip()
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    code = subprocess.call(
        ["make", target, f"STACK={stack}", f"PYTEST_ARGS={args}"], cwd=ROOT, env=env
    )
    print(
        f"{stage}: {cpu_seconds() - cpu0:.0f} CPU-s, {time.monotonic() - wall0:.0f} s wall, exit {code}"
    )
    try:  # back to the root group, and the stage's group gone: nothing left behind
        (CGROUPS / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()
    except OSError:
        pass
    return code


def summarize(lines: list[dict[str, Any]], top: int = 15) -> dict[str, Any]:
    """Per stage: CPU-seconds in all, per module (largest first) and its costliest tests.

    Example:
        >>> s = summarize([{"id": "tests/a.py::t", "cpu": 2.0, "wall": 1.0, "stage": "18"}])
        >>> s["18"]["cpu_s"], s["18"]["modules"]
        (2.0, {'a.py': 2.0})
    """
    out: dict[str, Any] = {}
    stages: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        stages[line.get("stage") or "?"].append(line)
    for stage, tests in stages.items():
        modules: dict[str, float] = defaultdict(float)
        for t in tests:
            modules[t["id"].split("::")[0].rsplit("/", 1)[-1]] += t["cpu"]
        costly = sorted(tests, key=lambda t: -t["cpu"])[:top]
        out[stage] = {"tests": len(tests), "cpu_s": round(sum(t["cpu"] for t in tests), 1),
                      "modules": {m: round(c, 1) for m, c in sorted(modules.items(), key=lambda kv: -kv[1])},
                      "costliest": [{"id": t["id"], "cpu_s": t["cpu"], "wall_s": t["wall"]} for t in costly]}  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one stage, profiled")
    r.add_argument("stack")
    r.add_argument("--tf-keras", action="store_true", help="make test-tf-keras instead")
    r.add_argument("--out", type=Path, default=Path(os.environ.get(PROFILE_ENV, DEFAULT_OUT)))
    s = sub.add_parser(
        "summary", help="per stage and module; writes " + str(RESULT.relative_to(ROOT))
    )
    s.add_argument("file", type=Path, nargs="?", default=DEFAULT_OUT)
    s.add_argument("--note", default="", help="what was measured, and how")
    a = parser.parse_args(argv)
    if a.command == "run":
        return run(a.stack, a.tf_keras, a.out)
    lines = [json.loads(x) for x in a.file.read_text().splitlines() if x.strip()]
    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "note": a.note,
        "stages": summarize(lines),
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    for stage, v in result["stages"].items():
        print(f"{stage}: {v['cpu_s']:.0f} CPU-s over {v['tests']} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
