"""A seeded chaos run: K ``hvdrunner.torch.fit`` jobs on the two-host cluster, each struck by
random faults, with and without ``HorovodRunner(max_restarts=2)``; each job's outcome judged.

Two hosts (network namespaces, tests/helpers/netns_cluster.py, loopback name mode), 2 ranks
each; the job and its judge are tests/helpers/faults_on_cluster.py: fit of a linear model,
8 epochs, a checkpoint per epoch, MLflow in sqlite. Every job draws, from ``--seed``:

- its first fault: a rank SIGKILLed (jobs 0, 1, 4, 5, ...), or the whole host of a rank
  killed (jobs 2, 3, 6, 7, ...; a replacement worker starts 3 s later), of a random rank,
  in a random epoch, a random moment into it;
- ``max_restarts``: 2 for even jobs, 0 for odd ones; jobs with restarts may draw a second
  fault in attempt 2.

Outcomes: ``recovered`` (same final weights as the undisturbed job within 1e-5, one
FINISHED run, each metric step once, no process left), ``failed-loudly`` (the error names
the fault, the run FAILED, no process left, within the bound), or ``defect`` (a hang,
different weights, a RUNNING run, a leftover process, missing or doubled steps).

Needs root (network namespaces). Results: ``benchmarks/results/chaos-torch.json``.

    .venv-19/bin/python benchmarks/chaos.py [--jobs 10 --seed 26]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from _bench import context

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
import faults_on_cluster as foc  # noqa: E402
from multihost_job import Job  # noqa: E402
from netns_cluster import NetnsCluster, unavailable  # noqa: E402

RESULTS = Path(__file__).parent / "results"
#: A job that takes longer than this is judged hung (3 attempts of ~30 s, plus waits).
BOUND_S = 300.0
SLOW_S = 0.3  # each epoch lasts at least this: faults land mid-training


def draw(rng: random.Random, restarts: int, first: str) -> list[foc.Fault]:
    """One job's faults: the first (of kind ``first``) in attempt 1; with restarts, maybe a
    second of a random kind in attempt 2."""
    faults = []
    for attempt in (1, 2) if restarts else (1,):
        if attempt == 2 and rng.random() < 0.5:
            break
        kind = first if attempt == 1 else rng.choice(["rank", "host"])
        # Attempt 2 resumes at the epoch attempt 1 died in: a later epoch is sure to come.
        lowest = 1 if attempt == 1 else faults[0].epoch
        faults.append(foc.Fault(kind=kind, rank=rng.randrange(foc.RANKS),
                                epoch=rng.randrange(lowest, foc.EPOCHS - 1), attempt=attempt,
                                delay_s=round(rng.uniform(0, SLOW_S), 2)))  # fmt: skip
    return faults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=26)
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"chaos: {why}")
        return 2
    from hvdrunner.spark import local_session

    rng = random.Random(args.seed)
    rows = []
    t0 = time.monotonic()
    with NetnsCluster(hosts=2, mode="loopback") as cluster:
        spark = local_session(cluster.master_url, app_name="hvdrunner-chaos",
                              **cluster.driver_conf())  # fmt: skip
        cluster.wait_for_executors(spark.sparkContext)
        job = Job(cluster, spark)
        reference = foc.run_job(job, "undisturbed", [], max_restarts=0, slow_s=SLOW_S)
        assert reference["error"] is None, reference
        for i in range(args.jobs):
            # Every pairing of restarts (even jobs) and the first fault's kind comes up.
            restarts = 2 if i % 2 == 0 else 0
            faults = draw(rng, restarts, first="rank" if i // 2 % 2 == 0 else "host")
            out = foc.run_job(job, f"job{i}", faults, max_restarts=restarts, slow_s=SLOW_S)
            verdict, reasons = foc.judge(out, reference, BOUND_S)
            row = {"job": i, "max_restarts": restarts, "faults": out["faults"],
                   "outcome": verdict, "reasons": reasons, "seconds": out["seconds"],
                   "restarts": out["restarts"], "status": out["status"],
                   "error": (out["error"] or "")[:300],
                   "max_weight_diff": out.get("max_weight_diff")}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        spark.stop()
    counts = {k: sum(r["outcome"] == k for r in rows)
              for k in ("recovered", "failed-loudly", "defect")}  # fmt: skip
    result = {
        **context(),
        "command": f"benchmarks/chaos.py --jobs {args.jobs} --seed {args.seed}",
        "cluster": "2 hosts (network namespaces, loopback names) x 2 ranks, torch fit of a "
        f"linear model, {foc.EPOCHS} epochs, checkpoint every epoch",
        "bound_s": BOUND_S,
        "outcomes": counts,
        "wall_s": round(time.monotonic() - t0, 1),
        "jobs": rows,
    }
    (RESULTS / "chaos-torch.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(counts))
    return 0 if counts["defect"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
