"""HorovodRunner on local-cluster[2,1,1024]: two real executors, GPUs from Spark's scheduler.

There is no GPU here: a fake discovery script (tests/helpers/fake_gpu_discovery.sh) makes
Spark believe each worker owns one, which is all the runner reads (``TaskContext.resources``).
Runs in a subprocess because a process holds one SparkContext and the suite's is local[2].
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).parent / "helpers" / "cluster_job.py"
# Spark's GPU scheduling (task resources) on Spark 3.5 - DBR 15.4 LTS ML GPU - and 4.1.
pytestmark = pytest.mark.stacks("15.4", "18")


@pytest.fixture(scope="module")
def cluster_result(tmp_path_factory) -> dict:
    counter = tmp_path_factory.mktemp("gpus") / "counter"
    proc = subprocess.run(
        [sys.executable, str(HELPER), str(counter)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_two_executors_one_rank_each(cluster_result):
    assert cluster_result["executors"] == 2
    ranks = cluster_result["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert ranks[0]["ppid"] != ranks[1]["ppid"]  # supervised by different executors' workers


def test_each_rank_sees_only_its_task_gpu(cluster_result):
    cudas = sorted(r["cuda"] for r in cluster_result["ranks"])
    assert cudas == ["0", "1"]


def test_gpu_slots_are_counted_in_preflight(cluster_result):
    msg = cluster_result["too_many"]
    assert "np=3" in msg and "2 task slots" in msg and "spark.task.resource.gpu.amount=1" in msg


def test_dynamic_allocation_is_refused(cluster_result):
    assert "spark.dynamicAllocation.enabled" in cluster_result["dynamic_allocation"]
