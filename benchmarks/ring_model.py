"""Beyond two hosts, on paper: a ring-allreduce model of step time and scaling efficiency,
fitted to the two-host measurements and checked against them.

One step on ``n`` hosts (one rank each) is its compute plus the gradient exchange, averaged
over ``backward_passes_per_step`` (k) batches:

    step(n) = compute + exchange(n) / k
    exchange(n) = codec + overhead + 2 (n - 1) latency + 2 (n - 1) / n * bytes / min(link, host)

``bytes`` is the gradients' size (halved by fp16 compression, which adds ``codec``: the casts,
measured); ``host`` is the rate one host's allreduce path reaches on an unshaped link
(gloo over TCP on these cores); ``overhead`` what a 2-host allreduce costs beyond its bytes
(Horovod's cycle and negotiation); ``latency`` one ring hop. Scaling efficiency is
compute / step(n): the share of a step spent computing, i.e. weak-scaling throughput per
host against one host alone.

Fitted on benchmarks/results/multihost-modern.json (two netns hosts; MLP 784-1024-1024-10,
7.45 MB of gradients; unshaped, 10 and 1 Gbit/s links), checked on its ``fit`` rows; then
predicted for 2..32 hosts at 10 and 25 Gbit/s for MLP-sized and ResNet-50-sized (102 MB)
gradients, with fp16 and k = 4. ResNet-50's compute per step is this machine's, from
benchmarks/results/synthetic_resnet50-torch.json (1 rank). Results in
benchmarks/results/ring_model.json.

The model ignores: overlap of the exchange with backward (Horovod starts allreducing the
first gradients before backward ends: real steps can be shorter); contention between ranks
of one host (one rank per host here); the switch (a non-blocking fabric assumed); stragglers
and jitter, which grow with n; per-hop latency beyond the measured loopback figure; and the
hierarchical/NCCL paths of GPU clusters.

With ``--hosts 3`` (needs root) it also measures the allreduce of the MLP's gradients alone
on 2 and 3 network-namespace hosts (one core, one rank each) over 1 Gbit/s links, where the
wire dominates, and checks the model's (n - 1) / n growth against it.

    .venv-18/bin/python benchmarks/ring_model.py [--hosts 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from _bench import save

RESULTS = Path(__file__).parent / "results"
RESNET50_BYTES = 25_557_032 * 4
MLP_BYTES = 7.45 * 2**20
LATENCY_MS = 0.05  # one ring hop: half the 96 us TCP round trip measured between two processes here


@dataclass(frozen=True)
class Exchange:
    """What one host's allreduce path costs, fitted to the two-host measurements."""

    host_gbit: float  # the rate the allreduce reaches when the link is not the limit
    overhead_ms: float  # per exchange, beyond its bytes (cycle, negotiation)
    codec_ms_per_mb: float  # fp16 compression's casts, per MB of float32 gradients
    latency_ms: float = LATENCY_MS


def exchange_ms(
    ex: Exchange, n: int, nbytes: float, link_gbit: float | None, fp16: bool = False
) -> float:
    """One ring allreduce of ``nbytes`` of float32 gradients over ``n`` hosts.

    Example:
        >>> exchange_ms(Exchange(5.0, 1.0, 0.0, 0.0), 2, 10e6, None)  # 10 MB at 5 Gbit/s
        17.0
    """
    if n == 1:
        return 0.0
    sent = nbytes / 2 if fp16 else nbytes
    rate = ex.host_gbit if link_gbit is None else min(ex.host_gbit, link_gbit)
    wire = 2 * (n - 1) / n * sent * 8 / (rate * 1e9) * 1e3
    codec = ex.codec_ms_per_mb * nbytes / 2**20 if fp16 else 0.0
    return codec + ex.overhead_ms + 2 * (n - 1) * ex.latency_ms + wire


def step_ms(
    ex: Exchange, compute_ms: float, n: int, nbytes: float, link_gbit: float | None,
    fp16: bool = False, passes: int = 1,
) -> float:  # fmt: skip
    """Compute plus the exchange, the exchange shared by ``passes`` batches."""
    return compute_ms + exchange_ms(ex, n, nbytes, link_gbit, fp16) / passes


def fit_exchange(rows: list[dict]) -> Exchange:
    """The host rate from the unshaped allreduce; the overhead from the 1 Gbit/s one (where
    the wire time is known); the fp16 casts from the unshaped fp16 step."""
    by = {(r["link"], r["variant"]): r for r in rows}
    host = by[("unshaped veth", "allreduce alone")]["algbw_gbit_per_s"]
    slow = by[("1 Gbit/s", "allreduce alone")]["step_ms"]
    overhead = max(0.0, slow - exchange_ms(Exchange(host, 0.0, 0.0), 2, MLP_BYTES, 1.0))
    base = Exchange(host, overhead, 0.0)
    compute = by[("unshaped veth", "no_exchange")]["step_ms"]
    fp16_step = by[("unshaped veth", "fit compression=fp16")]["step_ms"]
    codec = fp16_step - compute - exchange_ms(base, 2, MLP_BYTES, None, fp16=True)
    return Exchange(host, overhead, max(0.0, codec) / (MLP_BYTES / 2**20))


LINKS = {"unshaped veth": None, "10 Gbit/s": 10.0, "1 Gbit/s": 1.0}
VARIANTS = {"fit": (False, 1), "fit compression=fp16": (True, 1),
            "fit backward_passes_per_step=4": (False, 4)}  # fmt: skip


def check(ex: Exchange, rows: list[dict]) -> list[dict]:
    """Predicted against measured two-host steps, every link and knob measured."""
    by = {(r["link"], r["variant"]): r for r in rows}
    out = []
    for link, gbit in LINKS.items():
        compute = by[(link, "no_exchange")]["step_ms"]
        for variant, (fp16, passes) in VARIANTS.items():
            measured = by[(link, variant)]["step_ms"]
            predicted = step_ms(ex, compute, 2, MLP_BYTES, gbit, fp16, passes)
            out.append({"link": link, "variant": variant, "measured_ms": measured,
                        "predicted_ms": round(predicted, 1),
                        "error": round(predicted / measured - 1, 3)})  # fmt: skip
    return out


def predict(measured: Exchange, compute: dict[str, float]) -> list[dict]:
    """Scaling efficiency for 2..32 hosts, 10 and 25 Gbit/s, both gradient sizes, the knobs;
    for hosts like these (their allreduce path tops out at ``host_gbit``, fp16 casts at
    their measured cost) and for hosts that fill the link (free casts, as on GPUs)."""
    sizes = {"MLP (7.45 MB)": MLP_BYTES, "ResNet-50 (97.5 MB)": RESNET50_BYTES}
    hosts = {f"these hosts ({measured.host_gbit} Gbit/s)": measured,
             "link-bound hosts": Exchange(float("inf"), measured.overhead_ms, 0.0)}  # fmt: skip
    knobs = {"none": (False, 1), "fp16": (True, 1), "backward_passes_per_step=4": (False, 4)}
    rows = []
    for (model, nbytes), c in zip(sizes.items(), compute.values(), strict=True):
        for (host, ex), gbit in ((h, g) for h in hosts.items() for g in (10.0, 25.0)):
            for knob, (fp16, passes) in knobs.items():
                row: dict = {"model": model, "compute_ms": round(c, 1), "hosts": host,
                             "link_gbit": gbit, "knob": knob}  # fmt: skip
                for n in (2, 4, 8, 16, 32):
                    row[f"efficiency_{n}"] = round(
                        c / step_ms(ex, c, n, nbytes, gbit, fp16, passes), 3
                    )
                exchange_32 = exchange_ms(ex, 32, nbytes, gbit, fp16) / passes
                row["compute_ms_for_90pct_at_32"] = round(9 * exchange_32, 1)
                rows.append(row)
    return rows


def measure_allreduce(ex: Exchange, hosts: int, gbit: float = 1.0) -> list[dict]:
    """The gradients' grouped allreduce alone on 2..``hosts`` netns hosts, against the model."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from netns_cluster import NetnsCluster, Shape
    from pyspark.sql import functions as F
    from scaling import WIDTH, alone

    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.spark import local_session

    out = []
    with NetnsCluster(hosts=hosts, cores=1, shape=Shape(rate_mbit=int(gbit * 1000))) as cluster:
        spark = local_session(cluster.master_url, app_name="bench-ring", **cluster.driver_conf())
        spark.sparkContext.setLogLevel("ERROR")
        cluster.wait_for_executors(spark.sparkContext)
        df = spark.range(4096).select(
            F.transform(F.sequence(F.lit(1), F.lit(WIDTH)), lambda j: (F.col("id") * j % 997) / 997.0
                        ).cast("array<float>").alias("pixels"),
            (F.col("id") % 10).cast("int").alias("label"),
        )  # fmt: skip
        data = prepare(df, features="pixels", label="label", shared=True,
                       cache_dir=str(Path(cluster.work) / "data"))  # fmt: skip
        for n in range(2, hosts + 1):
            measured = HorovodRunner(np=n, start_timeout=120).run(alone, data=data)
            predicted = exchange_ms(ex, n, MLP_BYTES, gbit)
            out.append({"hosts": n, "link_gbit": gbit,
                        "measured_ms": measured["allreduce_alone_ms"],
                        "predicted_ms": round(predicted, 1),
                        "error": round(predicted / measured["allreduce_alone_ms"] - 1, 3)})  # fmt: skip
            print(json.dumps(out[-1]), flush=True)
        spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=0, help="measure on 2..N netns hosts")
    args = parser.parse_args()
    multihost = json.loads((RESULTS / "multihost-modern.json").read_text())
    synthetic = json.loads((RESULTS / "synthetic_resnet50-torch.json").read_text())
    ex = fit_exchange(multihost["rows"])
    mlp_compute = multihost["rows"][0]["step_ms"]  # unshaped no_exchange
    per_image_ms = 1000 / synthetic["horovodrunner"]["np1_img_sec_per_rank"]
    resnet_batch = int(synthetic["what"].split("batch ")[1].split("/")[0])
    checked = check(ex, multihost["rows"])
    out = {
        "what": (
            "ring allreduce model: step = compute + (codec + overhead + 2(n-1) latency + "
            "2(n-1)/n bytes / min(link, host)) / backward_passes_per_step; one rank per host; "
            "fitted to multihost-modern.json (2 netns hosts), compute from this machine"
        ),
        "fitted": {
            "host_gbit": ex.host_gbit,
            "overhead_ms": round(ex.overhead_ms, 2),
            "codec_ms_per_mb": round(ex.codec_ms_per_mb, 2),
            "latency_ms": ex.latency_ms,
        },  # fmt: skip
        "check_two_hosts": checked,
        "check_median_abs_error": round(statistics.median(abs(r["error"]) for r in checked), 3),
        "resnet50_compute_ms": round(per_image_ms * resnet_batch, 1),
        "predicted": predict(ex, {"mlp": mlp_compute, "resnet50": per_image_ms * resnet_batch}),
        "check_more_hosts": measure_allreduce(ex, args.hosts) if args.hosts >= 2 else None,
        "horovod_published": "about 90% scaling efficiency for Inception V3 and ResNet-101 on "
        "512 GPUs (horovod README; 25 Gbit/s RoCE, NCCL)",
    }
    save(RESULTS / "ring_model.json", out)


if __name__ == "__main__":
    main()
