"""A restart that must shrink because another job holds slots (tests/test_restart_promises.py).

local[3]: a blocker job holds one slot from the start; the Horovod job (np=2, min_np=1,
max_restarts=1) runs attempt 1 on the other two; rank 1 dies. While attempt 1 runs, a
second blocker is submitted and queues; when attempt 1's tasks end it takes one of their
slots, so one slot is free for the restart. The restart must run with that one rank (not
wait ``start_timeout`` for two slots the cluster has but another job holds).

Prints ``RESULT {"attempt": 2, "size": 1, ...}`` or ``ERROR <message>``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def train(marks: str) -> dict[str, Any]:
    import hvdrunner.hvd_torch as hvd  # the engine, every stack's default: the launcher's case
    from hvdrunner.distributed import attempt

    hvd.init()
    Path(marks, f"attempt{attempt()}-rank{hvd.rank()}").touch()
    if attempt() == 1:
        queued = Path(marks, "blocker-2-queued")  # seen by the driver's status tracker
        deadline = time.monotonic() + 60
        while not queued.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if hvd.rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    return {"attempt": attempt(), "size": hvd.size()}


def _hold(sc: Any, group: str, seconds: float) -> None:
    sc.setJobGroup(group, "a job of someone else", True)
    try:
        sc.parallelize([0], 1).map(lambda _: time.sleep(seconds)).collect()
    except Exception:  # noqa: BLE001,S110 - cancelled at the end, as intended
        pass


def main(work: str) -> int:
    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    marks = Path(work, "marks")
    marks.mkdir(parents=True, exist_ok=True)
    spark = local_session("local[3]", app_name="hvdrunner-shrink")
    sc = spark.sparkContext
    sc.parallelize(range(3), 3).count()  # executor warm
    blockers = [threading.Thread(target=_hold, args=(sc, "blocker-1", 120), daemon=True)]
    blockers[0].start()
    while sc.statusTracker().getActiveStageIds() == []:
        time.sleep(0.1)

    def second_blocker() -> None:
        while not (marks / "attempt1-rank1").exists():
            time.sleep(0.1)
        _hold(sc, "blocker-2", 120)

    def when_queued() -> None:  # what the ranks wait for: the second blocker's job exists
        while not sc.statusTracker().getJobIdsForGroup("blocker-2"):
            time.sleep(0.05)
        (marks / "blocker-2-queued").touch()

    blockers.append(threading.Thread(target=second_blocker, daemon=True))
    blockers[1].start()
    threading.Thread(target=when_queued, daemon=True).start()
    try:
        runner = HorovodRunner(np=2, max_restarts=1, min_np=1, start_timeout=30)
        value = runner.run(train, marks=str(marks))
        print("RESULT " + json.dumps(value), flush=True)
        code = 0
    except Exception as exc:  # noqa: BLE001 - reported to the test
        print(f"ERROR {type(exc).__name__}: {exc}"[:3000], flush=True)
        code = 1
    finally:
        sc.cancelJobGroup("blocker-1")
        sc.cancelJobGroup("blocker-2")
        spark.stop()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
