"""The petastorm recipes of docs/petastorm.md: validation accuracy and wall time, per feed.

Runs each recipe as written (2 ranks, local[2], digits: 1,437 training rows in 7 uneven
partitions, 360 for validation) ``--reps`` times with ``hvdrunner.petastorm``, and on a
stack where petastorm imports (15.4) again with real petastorm, only its import line swapped.
Writes benchmarks/results/petastorm_recipes-<stack>.json.

    STACK=15.4 .venv-15.4/bin/python benchmarks/petastorm_recipes.py [--reps 2]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import context, stack

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "petastorm.md"
RESULTS = Path(__file__).parent / "results"
DROP_IN = "from hvdrunner.petastorm.spark import"


def recipe(name: str) -> str:
    found = re.search(
        rf"<!-- runs: tests/\S+\.py \({name}\)[^>]*-->\n```python\n(.*?)```", DOC.read_text(), re.S
    )
    if not found:
        raise SystemExit(f"docs/petastorm.md has no {name} recipe")
    return found.group(1)


def frames(spark):
    import pandas as pd
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    pdf = pd.DataFrame({"pixels": (x[order] / 16.0).astype("float32").tolist(),
                        "label": y[order].astype("int32")})  # fmt: skip
    train, val = pdf.iloc[:1437], pdf.iloc[1437:]
    return spark.createDataFrame(train).repartition(7), spark.createDataFrame(val).repartition(3)


def run(source: str, spark, cache: str) -> tuple[float, float]:
    df_train, df_val = frames(spark)
    ns = {"__name__": "__main__", "spark": spark, "df_train": df_train, "df_val": df_val,
          "cache_url": f"file://{cache}"}  # fmt: skip
    start = time.perf_counter()
    exec(compile(source, str(DOC), "exec"), ns)
    return float(ns["val_accuracy"]), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="petastorm-recipes")
    name = "keras" if importlib.util.find_spec("tensorflow") is not None else "torch"
    source = recipe(name)
    feeds = {"hvdrunner.petastorm": source}
    if importlib.util.find_spec("petastorm") is not None:
        try:
            import petastorm.spark  # noqa: F401  (imports only with pyarrow < 15)

            label = f"petastorm {importlib.metadata.version('petastorm')}"
            feeds[label] = source.replace(DROP_IN, "from petastorm.spark import")
        except ImportError:
            pass
    runs: dict[str, tuple[list[float], list[float]]] = {feed: ([], []) for feed in feeds}
    for rep in range(args.reps):  # the feeds interleaved, so that a slow minute hits both
        for feed, code in feeds.items():
            with tempfile.TemporaryDirectory() as cache:
                acc, sec = run(code, spark, cache)
            runs[feed][0].append(acc)
            runs[feed][1].append(sec)
            print(f"{feed} (rep {rep + 1}): val_accuracy {acc:.4f} in {sec:.1f} s", flush=True)
    out = {feed: {"val_accuracy": accs, "seconds": [round(s, 1) for s in secs],
                  "median_seconds": round(statistics.median(secs), 1),
                  "val_accuracy_range": [min(accs), max(accs)]}
           for feed, (accs, secs) in runs.items()}  # fmt: skip
    result = {
        **context(),
        "recipe": f"docs/petastorm.md, {name} recipe, as written; 2 ranks on local[2]",
        "command": f"STACK={stack()} python benchmarks/petastorm_recipes.py --reps {args.reps}",
        "feeds": out,
    }
    path = RESULTS / f"petastorm_recipes-{stack()}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    spark.stop()


if __name__ == "__main__":
    main()
