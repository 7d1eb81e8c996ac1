"""Gradient exchange across hosts: allreduce bandwidth against the link rate, and `fit`'s
weak-scaling efficiency at 2 hosts against the no-exchange limit, with the exchange knobs.

Two hosts (network namespaces, tests/helpers/netns_cluster.py), one Spark worker with one
core each, np=2 (one rank per host, so every byte of the allreduce crosses the link), for
each link shape: unshaped veth, 10 Gbit/s and 1 Gbit/s (``tc tbf`` on both veth ends; no
added delay: this VM's kernel has no sch_netem, "Specified qdisc kind is unknown"). Model, batch and data as in
benchmarks/scaling.py (MLP 784-1024-1024-10, 7.45 MB of float32 gradients, batch 128 per
rank, SGD, 1 TF thread per rank, median of the steady epochs):

- ``no_exchange``: the recipe without DistributedOptimizer (each rank alone: the limit);
- ``fit``, ``fit compression=fp16``, ``fit backward_passes_per_step=4``;
- the grouped allreduce of the gradients alone (ms, and its algorithm bandwidth: bytes
  each rank sends, 2(n-1)/n of the gradients for a ring, over the time).

Needs root (network namespaces). Results: ``benchmarks/results/multihost-<stack>.json``.

    .venv-18/bin/python benchmarks/multihost.py [--rows 8192 --epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _bench import context, save
from scaling import BATCH, WIDTH, _step_ms, alone, fit_job, recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from netns_cluster import NetnsCluster, Shape, unavailable  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SHAPES = {
    "unshaped veth": None,
    "10 Gbit/s": Shape(rate_mbit=10_000),
    "1 Gbit/s": Shape(rate_mbit=1_000),
}
VARIANTS = {
    "no_exchange": (recipe, {"exchange": False}),
    "fit": (fit_job, {}),
    "fit compression=fp16": (fit_job, {"compression": "fp16"}),
    "fit backward_passes_per_step=4": (fit_job, {"backward_passes_per_step": 4}),
}


def one_shape(name: str, shape: Shape | None, rows: int, epochs: int) -> list[dict]:
    from pyspark.sql import functions as F

    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.spark import local_session

    out = []
    with NetnsCluster(hosts=2, cores=1, shape=shape) as cluster:
        threads = {f"spark.executorEnv.TF_NUM_{k}_THREADS": "1" for k in ("INTRAOP", "INTEROP")}
        spark = local_session(cluster.master_url, app_name="bench-multihost",
                              **cluster.driver_conf(), **threads,
                              **{"spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "3"})  # fmt: skip
        spark.sparkContext.setLogLevel("ERROR")
        cluster.wait_for_executors(spark.sparkContext)
        df = spark.range(rows).select(
            F.transform(F.sequence(F.lit(1), F.lit(WIDTH)),
                        lambda j: ((F.col("id") * j) % 997).cast("float") / 997).alias("pixels"),
            (F.col("id") % 10).cast("int").alias("label"),
        )  # fmt: skip
        data = prepare(df, features="pixels", label="label", shared=True,
                       cache_dir=os.path.join(cluster.work, "data"))  # fmt: skip
        steps = rows // 2 // BATCH
        for variant, (fn, kw) in VARIANTS.items():
            args = {"rows": rows, **kw} if fn is recipe else {"data": data, **kw}
            marks = HorovodRunner(np=2, start_timeout=120).run(fn, epochs=epochs, **args)["marks"]
            step = _step_ms(marks, steps)
            row = {"link": name, "variant": variant, "step_ms": step,
                   "samples_per_s": round(2 * BATCH * 1000 / step)}  # fmt: skip
            out.append(row)
            print(json.dumps(row), flush=True)
        parts = HorovodRunner(np=2, start_timeout=120).run(alone, data=data)
        sent = 2 * (2 - 1) / 2 * parts["grad_bytes"]
        ms = parts["allreduce_alone_ms"]
        row = {"link": name, "variant": "allreduce alone", "step_ms": ms,
               "algbw_gbit_per_s": round(8 * sent / (ms / 1000) / 1e9, 2),
               "link_gbit_per_s": shape.rate_mbit / 1000 if shape and shape.rate_mbit else None}  # fmt: skip
        out.append(row)
        print(json.dumps(row), flush=True)
        spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"benchmarks/multihost.py {why}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    t0 = time.monotonic()
    rows: list[dict] = []
    for name, shape in SHAPES.items():
        rows += one_shape(name, shape, args.rows, args.epochs)
    limit = {r["link"]: r["samples_per_s"] for r in rows if r["variant"] == "no_exchange"}
    for r in rows:
        if "samples_per_s" in r:
            r["efficiency_vs_no_exchange"] = round(r["samples_per_s"] / limit[r["link"]], 3)
    out = {
        "what": f"2 hosts (netns) x 1 rank, MLP {WIDTH}-1024-1024-10 (7.45 MB gradients), batch "
        f"{BATCH}/rank, {args.rows} rows, SGD, median of {args.epochs - 1} steady epochs, 1 TF "
        f"thread per rank; links rate-limited with tc tbf on both veth ends (no netem here)",
        "rows": rows,
        "wall_s": round(time.monotonic() - t0),
        **context(),
    }
    save(RESULTS / f"multihost-{out['stack']}.json", out)


if __name__ == "__main__":
    main()
