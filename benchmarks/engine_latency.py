"""The per-call cost of a small collective: hvdrunner's engine against torch.distributed's
own ``all_reduce`` (and the compiled horovod where this stack has one), 2 ranks over gloo.

One job of 2 ranks runs every contender in turn, round after round (contenders interleaved:
the machine's noise falls on all alike); each figure is the median over rounds of the mean
time of ``--calls`` back-to-back calls, in ms. Sizes: 4 bytes (one float), 64 bytes (16
floats: a vector of metrics), 1 KiB (the largest the engine carries inside its round) and
4 KiB (on the wire).

    .venv-19/bin/python benchmarks/engine_latency.py [--rounds 7 --calls 200]

writes benchmarks/results/engine_latency-<stack>.json (``STACK=gpu``: ``-gpu.json``, with the
compiled horovod). The engine's contenders run under torchrun; the compiled horovod's
(``--compiled``, the gpu stack's CUDA build on CPU tensors) under ``horovodrun --gloo``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import context, save, stack  # noqa: E402

SIZES = {"4 B": 1, "64 B": 16, "1 KiB": 256, "4 KiB": 1024}


def _contenders(hvd, engine: bool) -> dict[str, Callable[[object], object]]:
    """Per size: the calls to time, each given the size's tensor."""
    import torch.distributed as dist

    calls: dict[str, Callable[[object], object]] = {}
    if engine:
        group = dist.new_group(list(range(hvd.size())), backend="gloo")
        calls["dist.all_reduce"] = lambda t: dist.all_reduce(t, group=group)
    label = "engine" if engine else "compiled horovod"
    calls[f"{label}: hvd.allreduce(name=...)"] = lambda t: hvd.allreduce(t, name="named")
    calls[f"{label}: hvd.allreduce (unnamed)"] = lambda t: hvd.allreduce(t)
    calls[f"{label}: hvd.allreduce_ (in place)"] = lambda t: hvd.allreduce_(t, name="inplace",
                                                                           op=hvd.Sum)  # fmt: skip
    calls[f"{label}: allreduce_async + synchronize"] = lambda t: hvd.synchronize(
        hvd.allreduce_async(t, name="async")
    )
    return calls


def worker(out: str, rounds: int, calls_per: int, engine: bool) -> None:
    import torch

    if engine:
        import hvdrunner.hvd_torch as hvd
    else:
        import horovod.torch as hvd
    hvd.init()
    contenders = _contenders(hvd, engine)
    times: dict[str, dict[str, list[float]]] = {s: {c: [] for c in contenders} for s in SIZES}
    for _ in range(rounds):
        for size, n in SIZES.items():
            t = torch.ones(n)
            for name, call in contenders.items():
                for _ in range(20):  # warm: the response cache, the sockets
                    call(t)
                started = time.perf_counter()
                for _ in range(calls_per):
                    call(t)
                times[size][name].append((time.perf_counter() - started) / calls_per * 1e3)
    if hvd.rank() == 0:
        medians = {s: {c: round(statistics.median(v), 3) for c, v in by.items()}
                   for s, by in times.items()}  # fmt: skip
        Path(out).write_text(json.dumps(medians))
    hvd.shutdown()


def _run(args: argparse.Namespace, engine: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        me = [__file__, "--worker", out, "--rounds", str(args.rounds), "--calls", str(args.calls)]
        if engine:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", *me]  # fmt: skip
        else:
            horovodrun = str(Path(sys.executable).parent / "horovodrun")
            cmd = [horovodrun, "--gloo", "-np", "2", sys.executable, *me, "--compiled"]
        subprocess.run(cmd, check=True, timeout=1800)
        return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--worker")
    parser.add_argument("--compiled", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.rounds, args.calls, engine=not args.compiled)
        return
    medians = _run(args, engine=True)
    try:
        import horovod.torch  # noqa: F401 - the compiled horovod, where the stack has one

        compiled = _run(args, engine=False)
        for size in medians:
            medians[size].update(compiled[size])
    except ImportError:
        pass
    ratios = {s: {c: round(v / by["dist.all_reduce"], 2) for c, v in by.items()}
              for s, by in medians.items()}  # fmt: skip
    name = "gpu" if os.environ.get("STACK") == "gpu" else stack()  # gpu: the compiled one too
    save(Path(__file__).parent / "results" / f"engine_latency-{name}.json", {
        "what": "ms per call, median over rounds of the mean of back-to-back calls, 2 ranks, "
                "gloo, CPU tensors; ratio: over dist.all_reduce of the same tensor",
        "command": f"benchmarks/engine_latency.py --rounds {args.rounds} --calls {args.calls}",
        **context(), "ms": medians, "ratio": ratios,
    })  # fmt: skip


if __name__ == "__main__":
    main()
