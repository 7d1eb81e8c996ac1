"""Host identity on a real multi-worker Spark standalone cluster: each worker in its own
network namespace (own interface and address), as on a real cluster. Spark reports the same
address for tasks of both workers here; hvdrunner must still see two hosts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).parent / "helpers" / "netns_cluster.py"


@pytest.mark.timeout(420)
def test_two_workers_in_their_own_namespaces_are_two_hosts():
    proc = subprocess.run([sys.executable, str(HELPER)], capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    ranks = sorted(result["ranks"], key=lambda r: int(r["HOROVOD_RANK"]))
    assert len(ranks) == 4
    by_ns: dict[str, list[int]] = {}
    for r in ranks:
        by_ns.setdefault(r["netns"], []).append(int(r["HOROVOD_RANK"]))
    assert sorted(by_ns.values()) == [[0, 1], [2, 3]]  # contiguous ranks per worker
    for r in ranks:
        assert r["HOROVOD_LOCAL_SIZE"] == "2" and r["HOROVOD_CROSS_SIZE"] == "2"
        # the interface of its own namespace that reaches the driver, not loopback
        assert r["HOROVOD_GLOO_IFACE"].startswith(result["prefix"] + "p")
    assert len({r["HOROVOD_HOSTNAME"] for r in ranks}) == 2
