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
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _bench import context, stack

# the recipe's data and runner are its test's (tests/test_petastorm_recipes.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from digits import recipe_frames  # noqa: E402
from docblocks import block, run_as_notebook  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DROP_IN = "from hvdrunner.petastorm.spark import"


def run(source: str, spark, cache: str) -> tuple[float, float]:
    """The recipe run as a notebook cell runs it, as its test runs it; its accuracy and
    seconds."""
    _, (df_train, df_val) = recipe_frames(spark)
    start = time.perf_counter()
    ns = run_as_notebook(source, "petastorm.md", spark=spark, df_train=df_train, df_val=df_val,
                         cache_url=f"file://{cache}")  # fmt: skip
    return float(ns["val_accuracy"]), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="petastorm-recipes")
    name = "keras" if importlib.util.find_spec("tensorflow") is not None else "torch"
    source = block("petastorm.md", name)
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
