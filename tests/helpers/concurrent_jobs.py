"""Three Horovod jobs on one local[4] Spark (tests/test_restarts.py): a and b (np=2 each) run
at once from two threads, b's rank 1 SIGKILLed in its first attempt (max_restarts=1); c
(np=2) is started while both hold all four slots, waits, and starts when slots free. Each
job's allreduce must be its own: a sums 1.0 over its ranks, b 3.0, c 2.0.

Prints ``JOB <name> ok <value> ...`` or ``JOB <name> error <message>`` per job.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

HOLD_S = 8.0  # a and b keep their slots this long, so c must queue behind them


def summed(value: float, die_once: bool) -> dict[str, Any]:
    # hvdrunner's engine, every stack's default: slots and rings are the launcher's to keep
    # apart, and torch imports in a third of TensorFlow's time
    import torch

    import hvdrunner.hvd_torch as hvd
    from hvdrunner.distributed import attempt

    started = time.time()
    hvd.init()
    if die_once and attempt() == 1 and hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    total = float(hvd.allreduce(torch.tensor(value), op=hvd.Sum))
    time.sleep(HOLD_S)
    again = float(hvd.allreduce(torch.tensor(value), op=hvd.Sum))  # still our ring
    return {"total": total, "again": again, "attempt": attempt(), "started": started,
            "key": os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")}  # fmt: skip


def _ranks() -> list[Any]:
    """This process's live rank processes (Spark's python workers run them as descendants)."""
    import psutil

    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "hvdrunner._launch.rank.worker" in " ".join(proc.cmdline()):
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _attempts(ranks: list[Any]) -> list[str]:
    import psutil

    seen = []
    for proc in ranks:
        try:
            seen.append(proc.environ().get("HVDRUNNER_ATTEMPT", "1"))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return seen


def _wait_for_ranks(ready: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not ready(_ranks()) and time.monotonic() < deadline:
        time.sleep(0.1)


def main(work: str) -> int:
    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    spark = local_session("local[4]", app_name="hvdrunner-concurrent")
    spark.sparkContext.parallelize(range(4), 4).count()  # executor warm
    out: dict[str, str] = {}

    def job(name: str, value: float, **runner: Any) -> None:
        called = time.time()
        try:
            r = HorovodRunner(np=2, start_timeout=120, **runner).run(
                summed, value=value, die_once=name == "b"
            )
            assert r["total"] == r["again"], r
            extra = f" attempt={r['attempt']}" if name == "b" else ""
            extra += f" waited={r['started'] - called:.1f}" if name == "c" else ""
            out[name] = f"ok {r['total']}{extra}"
        except Exception as exc:  # noqa: BLE001 - reported per job
            out[name] = f"error {type(exc).__name__}: {exc}"[:2000]

    threads = {"a": threading.Thread(target=job, args=("a", 1.0)),
               "b": threading.Thread(target=job, args=("b", 3.0), kwargs={"max_restarts": 1})}  # fmt: skip
    for t in threads.values():
        t.start()
    # c starts once a and b hold the four slots, b's restart included: seen, not waited for.
    _wait_for_ranks(lambda ranks: len(ranks) == 4 and _attempts(ranks).count("2") == 2, 120)
    threads["c"] = threading.Thread(target=job, args=("c", 2.0))
    threads["c"].start()
    for t in threads.values():
        t.join(timeout=250)
    for name in "abc":
        print(f"JOB {name} {out.get(name, 'error did not finish')}", flush=True)
    spark.stop()
    return 0 if all(v.startswith("ok") for v in out.values()) and len(out) == 3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
