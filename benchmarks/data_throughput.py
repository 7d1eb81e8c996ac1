"""Data throughput per rank on the same Parquet data: raw pyarrow vs petastorm vs hvdrunner.

    .venv/bin/python benchmarks/data_throughput.py [--rows 200000] [--reps 3]

Prepares ``rows`` × 784 float32 + int label once with ``hvdrunner.data.prepare`` (local[2]),
then times reading shard 0 of 2 into batches of 256 (rows delivered per second):
(a) pyarrow ``read_table`` + vectorized flatten into numpy, one epoch (the practical limit),
(b) petastorm's default TF path (``make_batch_reader`` + ``make_petastorm_dataset``,
    unbatch/batch as ``SparkDatasetConverter.make_tf_dataset`` does; 15.4 only), one epoch,
(c) ``PreparedData.tf_dataset(in_memory=False)``: streaming, shuffling on, one epoch,
(c2) the same without shuffling (the work (a) does, delivered as batched tensors),
(d) ``PreparedData.tf_dataset(in_memory=True)``, first epoch (decode + gather),
(e) the same over 3 epochs (one decode, then gathers only).
The page cache is warmed once first; each method then runs ``reps`` times. Writes medians
and ratios to benchmarks/results/data_throughput-<stack>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _bench import context, save

RESULTS = Path(__file__).parent / "results"
BATCH = 256


def raw_pyarrow(data) -> int:
    """The practical limit: read each file of the shard and flatten to numpy, nothing else
    (no shuffle, no batching; per chunk, without ``combine_chunks``' extra copy)."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from hvdrunner.data.reader import shard_pieces

    rows = 0
    for piece in shard_pieces(data.files, 0, 2):
        table = pq.read_table(
            os.path.join(data.local_path, piece.path), columns=["pixels", "label"]
        )
        table = table.slice(piece.start, piece.stop - piece.start)
        x = [pc.list_flatten(c).to_numpy().reshape(-1, 784) for c in table["pixels"].chunks]
        y = [c.to_numpy() for c in table["label"].chunks]
        rows += sum(map(len, x)) + 0 * len(np.concatenate(y))
    return rows


def petastorm_default(data) -> int:
    import tensorflow as tf
    from petastorm import make_batch_reader
    from petastorm.tf_utils import make_petastorm_dataset

    url = "file://" + data.local_path
    rows = 0
    with make_batch_reader(
        url, num_epochs=1, cur_shard=0, shard_count=2, schema_fields=["pixels", "label"]
    ) as reader:
        ds = make_petastorm_dataset(reader).unbatch().batch(BATCH).prefetch(1)
        for batch in ds:
            rows += int(tf.shape(batch.pixels)[0])
    return rows


def _hvdrunner(data, in_memory: bool, epochs: int, shuffle: bool = True) -> int:
    steps = data.steps_per_epoch(BATCH, 2)
    rows = 0
    with data.tf_dataset(
        BATCH, cur_shard=0, shard_count=2, in_memory=in_memory, shuffle=shuffle
    ) as ds:
        for x, _ in ds.take(epochs * steps):
            rows += int(x.shape[0])
    return rows


def hvdrunner_stream(data) -> int:
    """Streaming feed (shuffling on): every epoch decodes the files again."""
    return _hvdrunner(data, in_memory=False, epochs=1)


def hvdrunner_stream_no_shuffle(data) -> int:
    """Streaming feed doing what (a) does (no shuffle): the same work, batched tensors."""
    return _hvdrunner(data, in_memory=False, epochs=1, shuffle=False)


def hvdrunner_memory_first(data) -> int:
    """In-memory feed, first epoch: decode the whole shard, then gather batches."""
    return _hvdrunner(data, in_memory=True, epochs=1)


def hvdrunner_memory_3_epochs(data) -> int:
    """In-memory feed over 3 epochs: one decode, then TensorFlow gathers only."""
    return _hvdrunner(data, in_memory=True, epochs=3)


def timed(fn, data, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        rows = fn(data)
        out.append(rows / (time.perf_counter() - t))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--cache-dir", default=os.path.join(tempfile.gettempdir(), "hvdrunner-bench-cache")
    )
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from hvdrunner.data import prepare
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="bench-data")
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(args.rows).select(
        F.transform(
            F.sequence(F.lit(1), F.lit(784)),
            lambda i: ((F.col("id") * i) % 997).cast("float") / 997,
        ).alias("pixels"),
        (F.col("id") % 10).cast("int").alias("label"),
    )
    import shutil

    shutil.rmtree(args.cache_dir, ignore_errors=True)  # time a real write, not a cache hit
    t = time.perf_counter()
    data = prepare(df, features="pixels", label="label", cache_dir=args.cache_dir)
    prepare_s = time.perf_counter() - t
    spark.stop()

    import importlib.util

    readers = [
        ("a_raw_pyarrow", raw_pyarrow),
        ("c_hvdrunner_stream", hvdrunner_stream),
        ("c2_hvdrunner_stream_no_shuffle", hvdrunner_stream_no_shuffle),
        ("d_hvdrunner_memory_first_epoch", hvdrunner_memory_first),
        ("e_hvdrunner_memory_3_epochs", hvdrunner_memory_3_epochs),
    ]
    if importlib.util.find_spec("petastorm") is not None:  # 15.4 only: no petastorm on modern
        readers.insert(1, ("b_petastorm_default", petastorm_default))
    raw_pyarrow(data)  # warm the page cache
    results = {name: timed(fn, data, args.reps) for name, fn in readers}
    med = {k: round(statistics.median(v)) for k, v in results.items()}
    out = {
        "what": f"rows/s reading shard 0 of 2, {args.rows} rows x 784 float32 + int32 label, batch {BATCH}, one epoch",
        "rows_per_s_median": med,
        "rows_per_s_runs": {k: [round(x) for x in v] for k, v in results.items()},
        "ratio_stream_over_raw": round(med["c_hvdrunner_stream"] / med["a_raw_pyarrow"], 3),
        "ratio_stream_no_shuffle_over_raw": round(
            med["c2_hvdrunner_stream_no_shuffle"] / med["a_raw_pyarrow"], 3
        ),
        "ratio_memory_first_epoch_over_raw": round(
            med["d_hvdrunner_memory_first_epoch"] / med["a_raw_pyarrow"], 3
        ),
        "ratio_memory_3_epochs_over_raw": round(
            med["e_hvdrunner_memory_3_epochs"] / med["a_raw_pyarrow"], 3
        ),
        "ratio_stream_over_petastorm": (
            round(med["c_hvdrunner_stream"] / med["b_petastorm_default"], 3)
            if "b_petastorm_default" in med
            else None
        ),
        "prepare_s": round(prepare_s, 1),
        "files": len(data.files),
        **context(),
    }
    save(RESULTS / f"data_throughput-{out['stack']}.json", out)


if __name__ == "__main__":
    main()
