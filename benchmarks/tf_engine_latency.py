"""The cost of one small allreduce inside ``tf.function``: hvdrunner's engine (Horovod's
TensorFlow API on torch.distributed, ``hvdrunner.engine.tf``: one ``tf.py_function`` per
call) against the compiled ``horovod.tensorflow`` op, on 2 ranks of one host
(``HorovodRunner(np=-2)``, the modern stack, which has both), interleaved rep by rep.

Each rep, on each rank: ``hvd.init()``, a ``tf.function`` that allreduces (Sum) one float32
tensor of 1, 256 or 262,144 elements (4 B, 1 KiB, 1 MiB), 50 warm-up calls, then ``--calls``
timed calls; the figure is the median over reps of rank 0's mean per call. Results in
benchmarks/results/tf_engine_latency-modern.json.

    .venv-18/bin/python benchmarks/tf_engine_latency.py [--calls 500 --reps 3]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from pathlib import Path

from _bench import context, save, stack

RESULTS = Path(__file__).parent / "results"
SIZES = {"4 B": 1, "1 KiB": 256, "1 MiB": 262_144}
ENGINES = {"engine": "hvdrunner", "compiled": "horovod"}


def per_call_us(module: str, calls: int) -> dict[str, float]:
    """One rank: microseconds per allreduce call inside tf.function, per size."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    hvd = importlib.import_module(module)
    hvd.init()
    out = {}
    for label, n in SIZES.items():
        x = tf.ones([n], tf.float32)
        step = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
        for _ in range(50):
            step(x)
        started = time.perf_counter()
        for _ in range(calls):
            y = step(x)
        _ = y.numpy()
        out[label] = (time.perf_counter() - started) / calls * 1e6
    hvd.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from hvdrunner import HorovodRunner

    modules = {"engine": "hvdrunner.engine.tf", "compiled": "horovod.tensorflow"}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in modules}
    for _ in range(args.reps):
        for name, module in modules.items():
            os.environ["HVDRUNNER_ENGINE"] = ENGINES[name]
            runs[name].append(HorovodRunner(np=-2).run(per_call_us, module=module,
                                                       calls=args.calls))  # fmt: skip
    os.environ.pop("HVDRUNNER_ENGINE", None)
    medians = {name: {label: round(statistics.median(r[label] for r in reps), 1)
                      for label in SIZES} for name, reps in runs.items()}  # fmt: skip
    out = {
        "what": (
            f"one allreduce (Sum, float32) per tf.function call, 2 ranks on driver processes "
            f"(HorovodRunner(np=-2)), {args.calls} calls after 50 warm-up, rank 0's mean per "
            f"call in microseconds, median of {args.reps} interleaved reps"
        ),
        "us_per_call": medians,
        "engine_vs_compiled": {
            label: round(medians["engine"][label] / medians["compiled"][label], 2)
            for label in SIZES
        },  # fmt: skip
        **context(),
    }
    save(RESULTS / f"tf_engine_latency-{stack()}.json", out)


if __name__ == "__main__":
    main()
