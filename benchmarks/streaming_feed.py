"""Decoded images per second per rank: hvdrunner's feed against Mosaic Streaming and the
petastorm drop-in, on the same JPEG table, transform, batch and worker count.

A table of JPEG bytes (synthetic flowers, 500 images of 128x128, Spark's ``binaryFile``)
is written once per feed (``prepare``, ``write_mds``, ``make_spark_converter``); then each
feed is read by both ranks of a real ``HorovodRunner(np=2)`` job (local[2]) for whole
epochs of their shards, decoding each image with PIL, resizing it to 64x64 and scaling it to
[0, 1]. Contenders, interleaved rep by rep:

- ``hvdrunner feed``: ``prepare(df).transformed(spec, ...)``, ``data.batches`` (the feed
  ``hvdrunner.torch.fit`` and ``hvdrunner.keras.fit`` read; decode in threads);
- ``hvdrunner.streaming``: ``write_mds(df).transformed(spec, ...)``, ``data.batches``
  (Streaming's ``StreamingDataset`` under a DataLoader; decode in its worker processes);
- ``StreamingDataset (Streaming's way)``: the same shards, a ``StreamingDataset`` subclass
  decoding each sample in ``get_item``, a torch ``DataLoader`` with its default collate;
- ``petastorm drop-in``: ``make_spark_converter(df).make_torch_dataloader(...)``;
- real petastorm, the same calls, where it imports (the 15.4 replica: 0.12.1).

Images/s per rank over 10 epochs after the first batch (rank 0 and rank 1 both reported),
medians of the reps; and, for the two feeds ``hvdrunner.torch.fit`` takes, the wall time of a
whole 3-epoch image recipe job (a linear model on the decoded pixels). Results in
benchmarks/results/streaming_feed-<stack>.json.

    STACK=18 .venv-18/bin/python benchmarks/streaming_feed.py [--reps 3 --workers 2]
    STACK=15.4 .venv-15.4/bin/python benchmarks/streaming_feed.py   # with real petastorm
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _bench import context, flowers_table, save, stack

RESULTS = Path(__file__).parent / "results"
BATCH, SIZE, SOURCE, EPOCHS, READ_EPOCHS = 32, 64, 128, 3, 10


def decode(content: bytes) -> np.ndarray:
    from PIL import Image

    image = Image.open(io.BytesIO(content)).convert("RGB").resize((SIZE, SIZE))
    return np.asarray(image, dtype=np.float32) / 255.0


def decode_batch(frame: Any) -> Any:
    frame["features"] = frame["content"].map(decode)
    return frame.drop(columns=["content"])


def spec(spec_class: Any) -> Any:
    return spec_class(decode_batch, edit_fields=[("features", np.float32, (SIZE, SIZE, 3), False)],
                      selected_fields=["features", "label_index"])  # fmt: skip


def _timed(batches: Any, steps: int) -> float:
    """Images/s over ``steps`` batches, after the first (start-up is not the rate)."""
    next(batches)
    start = time.perf_counter()
    images = 0
    for _ in range(steps):
        images += len(next(batches)["label_index"])
    return images / (time.perf_counter() - start)


def read_rate(kind: str, data: Any, workers: int) -> list[float]:
    """Run on each rank: this rank's images/s over ``READ_EPOCHS`` epochs of its shard."""
    import hvdrunner.hvd_torch as hvd

    hvd.init()
    rows = len(data) if kind.startswith("petastorm") else data.num_rows
    steps = READ_EPOCHS * (-(-rows // hvd.size()) // BATCH)
    if kind in ("hvdrunner feed", "hvdrunner.streaming"):
        rate = _timed(data.batches(BATCH, seed=0), steps)
    elif kind.startswith("petastorm"):
        if kind == "petastorm drop-in":
            from hvdrunner.petastorm import TransformSpec
        else:
            from petastorm import TransformSpec

        with data.make_torch_dataloader(batch_size=BATCH, workers_count=workers,
                                        transform_spec=spec(TransformSpec),
                                        cur_shard=hvd.rank(), shard_count=hvd.size()) as loader:  # fmt: skip
            rate = _timed(_endless(loader), steps)
    else:
        rate = _timed(_endless(_streaming_own(data.path, workers)), steps)
    return hvd.allgather_object(round(rate, 1))


def _endless(loader: Any) -> Any:
    while True:
        yield from loader


def _streaming_own(path: str, workers: int) -> Any:
    """Streaming's own idiom: decode per sample in ``get_item``, DataLoader workers, default
    collate (world and shared memory as hvdrunner.streaming sets them up)."""
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    from hvdrunner.streaming import world

    class Decoded(StreamingDataset):  # type: ignore[misc]
        def get_item(self, idx: int) -> dict[str, Any]:
            sample = super().get_item(idx)
            return {"features": decode(sample["content"]), "label_index": sample["label_index"]}

    world.check()
    ds = Decoded(local=path, batch_size=BATCH, shuffle=True, shuffle_seed=0,
                 num_canonical_nodes=world.nodes())  # fmt: skip
    return DataLoader(ds, batch_size=BATCH, num_workers=workers)


def flat_model() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(SIZE * SIZE * 3, 5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    import hvdrunner.torch
    from hvdrunner import HorovodRunner
    from hvdrunner.data import TransformSpec, prepare
    from hvdrunner.petastorm import spark as drop_in
    from hvdrunner.spark import local_session
    from hvdrunner.streaming import write_mds

    spark = local_session("local[2]", app_name="streaming-feed")
    work = Path(tempfile.mkdtemp(prefix="streaming-feed-"))
    df, _ = flowers_table(spark, work / "flowers", SOURCE)
    spark.conf.set(drop_in.SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{work}/pc")

    def decoded(data: Any) -> Any:
        return data.transformed(spec(TransformSpec), "features", "label_index",
                                workers=args.workers)  # fmt: skip

    mds = write_mds(df, str(work / "mds"), columns=["content", "label_index"])
    feeds = {
        "hvdrunner feed": decoded(prepare(df, features=["content", "label_index"],
                                          cache_dir=str(work / "cache"))),
        "hvdrunner.streaming": decoded(mds),
        "StreamingDataset (Streaming's way)": mds,
        "petastorm drop-in": drop_in.make_spark_converter(df),
    }  # fmt: skip
    if importlib.util.find_spec("petastorm") is not None:  # the 15.4 replica
        import petastorm
        import petastorm.spark

        feeds[f"petastorm {petastorm.__version__}"] = petastorm.spark.make_spark_converter(df)
    rates: dict[str, list[list[float]]] = {name: [] for name in feeds}
    jobs: dict[str, list[float]] = {name: [] for name in list(feeds)[:2]}
    for rep in range(args.reps):  # interleaved: the machine's drift hits every feed alike
        for name, data in feeds.items():
            got = HorovodRunner(np=2).run(read_rate, kind=name, data=data, workers=args.workers)
            rates[name].append(got)
            print(f"rep {rep} {name}: {got} images/s per rank", flush=True)
        for name in jobs:  # a whole image recipe job on the two feeds fit takes
            start = time.perf_counter()
            HorovodRunner(np=2).run(hvdrunner.torch.fit, build_model=flat_model,
                                    data=feeds[name], epochs=EPOCHS, batch_size=BATCH,
                                    loss="cross_entropy", log_model=False, verbose=0)  # fmt: skip
            jobs[name].append(round(time.perf_counter() - start, 2))
            print(f"rep {rep} {name}: fit job {jobs[name][-1]} s", flush=True)
    out = {
        "what": f"images/s per rank of {len(feeds)} feeds of one table of {SOURCE}x{SOURCE} JPEG bytes "
        f"(500 images, binaryFile), both ranks of HorovodRunner(np=2) on local[2], each "
        f"decoding with PIL to {SIZE}x{SIZE}/255, batch {BATCH}, {args.workers} workers; over "
        f"{READ_EPOCHS} epochs after the first batch; medians of {args.reps} interleaved reps "
        f"(per rank); fit_job_s: a whole {EPOCHS}-epoch hvdrunner.torch.fit job (linear model) "
        f"on each feed fit takes, launch included",
        "feeds": {
            name: {
                "images_per_s_per_rank": [
                    statistics.median(r[k] for r in rates[name]) for k in (0, 1)
                ],
                "reps": rates[name],
                **(
                    {"fit_job_s": statistics.median(jobs[name]), "fit_job_reps": jobs[name]}
                    if name in jobs
                    else {}
                ),  # fmt: skip
            }
            for name in feeds
        },
        **context(),
    }
    mean = {n: statistics.mean(v["images_per_s_per_rank"]) for n, v in out["feeds"].items()}
    out["hvdrunner_feed_vs"] = {n: round(mean["hvdrunner feed"] / v, 3) for n, v in mean.items()
                                if n != "hvdrunner feed"}  # fmt: skip
    save(RESULTS / f"streaming_feed-{stack()}.json", out)
    for name, feed in feeds.items():
        if name.startswith("petastorm"):
            feed.delete()
    spark.stop()


if __name__ == "__main__":
    main()
