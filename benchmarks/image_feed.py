"""Decoding images on the ranks: images/s of one rank's feed, and the cache's size on disk.

A table of JPEG bytes (synthetic flowers, 500 images of 128x128, read with Spark's
``binaryFile`` source) goes through ``make_spark_converter`` and ``make_tf_dataset`` with the
same ``TransformSpec`` (decode with PIL, resize to 64x64, scale to [0, 1]), the same batch
size and ``workers_count``, as one rank of two reads it (``cur_shard=0, shard_count=2``):
hvdrunner's drop-in, and, on a stack where it imports (15.4), real petastorm,
interleaved rep by rep; images/s over whole passes of the shard. And the cache each writes
against the JPEG files' bytes. Results in benchmarks/results/image_feed-<stack>.json.

    STACK=15.4 .venv-15.4/bin/python benchmarks/image_feed.py [--reps 3 --workers 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import context, flowers_table, save, stack

RESULTS = Path(__file__).parent / "results"
BATCH, SIZE, SOURCE = 32, 64, 128


def transform_row(pd_batch):
    from PIL import Image

    def preprocess(content):
        image = Image.open(io.BytesIO(content)).convert("RGB").resize((SIZE, SIZE))
        return np.asarray(image, dtype=np.float32) / 255.0

    pd_batch["features"] = pd_batch["content"].map(preprocess)
    return pd_batch.drop(labels=["content"], axis=1)


def feed_rate(
    module, spec_class, df, cache: str, spark, workers: int, passes: int
) -> tuple[float, int]:
    """Images/s of shard 0 of 2 over ``passes`` whole passes; the cache's bytes on disk."""
    spark.conf.set(module.SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{cache}")
    converter = module.make_spark_converter(df)
    spec = spec_class(transform_row, edit_fields=[("features", np.float32, (SIZE, SIZE, 3), False)],
                      selected_fields=["features", "label_index"])  # fmt: skip
    per_pass = len(converter) // 2
    steps = passes * (per_pass // BATCH)
    with converter.make_tf_dataset(transform_spec=spec, batch_size=BATCH, workers_count=workers,
                                   cur_shard=0, shard_count=2) as ds:  # fmt: skip
        it = iter(ds)
        next(it)  # the pipeline started (threads, first decode): not part of the rate
        start = time.perf_counter()
        for _ in range(steps):
            next(it)
        seconds = time.perf_counter() - start
    on_disk = sum(p.stat().st_size for p in Path(cache).rglob("*.parquet"))
    converter.delete()
    return steps * BATCH / seconds, on_disk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()

    from hvdrunner import petastorm as drop_in
    from hvdrunner.petastorm import spark as drop_in_spark
    from hvdrunner.spark import local_session

    spark = local_session("local[2]", app_name="image-feed")
    work = Path(tempfile.mkdtemp(prefix="image-feed-"))
    df, jpeg_bytes = flowers_table(spark, work / "flowers", SOURCE)
    feeds = {"hvdrunner.petastorm": (drop_in_spark, drop_in.TransformSpec)}
    if importlib.util.find_spec("petastorm") is not None:
        import petastorm
        import petastorm.spark

        feeds["petastorm 0.13.1"] = (petastorm.spark, petastorm.TransformSpec)
    rates: dict[str, list[float]] = {name: [] for name in feeds}
    sizes: dict[str, int] = {}
    for rep in range(args.reps):  # interleaved: the machine's drift hits every feed alike
        for name, (module, spec) in feeds.items():
            slug = name.split()[0].replace(".", "-")  # petastorm cannot read a path with spaces
            rate, on_disk = feed_rate(module, spec, df, str(work / f"{slug}-{rep}"), spark,
                                      args.workers, args.passes)  # fmt: skip
            rates[name].append(round(rate, 1))
            sizes[name] = on_disk
            print(f"rep {rep} {name}: {rate:.0f} images/s", flush=True)
    out = {
        "what": f"{len(feeds)} feed(s) of a table of {SOURCE}x{SOURCE} JPEG bytes (500 images, "
        f"binaryFile), one rank of two (cur_shard=0, shard_count=2), make_tf_dataset with the "
        f"same TransformSpec (PIL decode, resize to {SIZE}x{SIZE}, /255), batch {BATCH}, "
        f"workers_count={args.workers}; images/s over {args.passes} whole passes after the first "
        f"batch, medians of {args.reps} interleaved reps; cache = the converter's Parquet "
        f"files on disk",
        "jpeg_bytes": jpeg_bytes,
        "feeds": {
            name: {
                "images_per_s": statistics.median(rates[name]),
                "reps": rates[name],
                "cache_bytes": sizes[name],
                "cache_vs_jpeg": round(sizes[name] / jpeg_bytes, 3),
            }
            for name in feeds
        },  # fmt: skip
        **context(),
    }
    if len(feeds) == 2:
        ours, theirs = (out["feeds"][n]["images_per_s"] for n in feeds)
        out["drop_in_vs_petastorm"] = round(ours / theirs, 3)
    save(RESULTS / f"image_feed-{stack()}.json", out)
    spark.stop()


if __name__ == "__main__":
    main()
