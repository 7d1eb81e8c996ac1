"""hvdrunner.data: real Spark writes, real Parquet reads, real Horovod ranks for the fit."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hvdrunner import HorovodRunner, HorovodRunnerError
from hvdrunner._paths import for_ranks, resolve
from hvdrunner.data import prepare

# Spark writes the shards, pyarrow reads them: both differ between the TF stacks
# (Spark 3.5 + pyarrow 14 on lts, Spark 4.1 + pyarrow 22 on 18; tests/conftest.py).
pytestmark = pytest.mark.stacks("15.4", "18")


def _numbered(spark, n: int, width: int = 3):
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.array(*[F.col("id").cast("double") + i for i in range(width)]).alias("x"),
        F.col("id").alias("row"),
    )


def _epoch_rows(data, shard: int, count: int, batch: int, **kw) -> np.ndarray:
    it = data.batches(batch, cur_shard=shard, shard_count=count, **kw)
    steps = data.steps_per_epoch(batch, count)
    return np.concatenate([next(it)["row"] for _ in range(steps)])


def test_exactly_once_over_one_epoch(spark, cache_dir):
    data = prepare(
        _numbered(spark, 512), features="x", label="row", cache_dir=cache_dir, rows_per_file=50
    )
    seen = [_epoch_rows(data, s, 2, 64) for s in range(2)]
    assert len(seen[0]) == len(seen[1]) == 256
    union = np.concatenate(seen)
    assert sorted(union.tolist()) == list(range(512))  # every row, none twice


def test_uneven_rows_give_identical_full_steps(spark, cache_dir):
    data = prepare(
        _numbered(spark, 1001), features="x", label="row", cache_dir=cache_dir, rows_per_file=97
    )
    assert data.steps_per_epoch(64, 2) == 8  # ceil(501 / 64)
    epochs = [_epoch_rows(data, s, 2, 64, shuffle=False) for s in range(2)]
    assert [len(e) for e in epochs] == [512, 512]
    assert set(np.concatenate(epochs).tolist()) == set(range(1001))  # no row dropped


def test_shuffle_is_seeded_and_changes_per_epoch(spark, cache_dir):
    data = prepare(
        _numbered(spark, 512), features="x", label="row", cache_dir=cache_dir, rows_per_file=50
    )
    steps = data.steps_per_epoch(32, 2)
    it = data.batches(32, cur_shard=0, shard_count=2, seed=7)
    first = np.concatenate([next(it)["row"] for _ in range(steps)])
    second = np.concatenate([next(it)["row"] for _ in range(steps)])
    again = _epoch_rows(data, 0, 2, 32, seed=7)
    other = _epoch_rows(data, 0, 2, 32, seed=8)
    assert sorted(first) == sorted(second)  # same shard...
    assert not np.array_equal(first, second)  # ...reshuffled each epoch
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    resumed = _epoch_rows(data, 0, 2, 32, seed=7, first_epoch=1)  # a job resumed at epoch 1
    np.testing.assert_array_equal(resumed, second)


def test_array_vector_and_reshape_columns(spark, cache_dir):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    base = spark.range(64).select(
        F.col("id").cast("double").alias("a"),
        (F.col("id") * 2).cast("float").alias("b"),
        F.array(
            *[F.array(F.lit(1.0), F.lit(2.0), F.col("id").cast("double")) for _ in range(2)]
        ).alias("grid"),
        F.array(*[F.lit(float(i)) for i in range(6)]).alias("flat"),
        (F.col("id") % 3).cast("int").alias("label"),
    )
    df = VectorAssembler(inputCols=["a", "b"], outputCol="vec").transform(base)
    data = prepare(
        df,
        features=["vec", "grid", "flat"],
        label="label",
        cache_dir=cache_dir,
        shapes={"flat": (2, 3)},
    )
    batch = next(data.batches(16, cur_shard=0, shard_count=1, shuffle=False))
    assert batch["vec"].shape == (16, 2) and batch["vec"].dtype == np.float32
    assert batch["grid"].shape == (16, 2, 3) and batch["grid"].dtype == np.float32
    assert batch["flat"].shape == (16, 2, 3)
    assert batch["label"].dtype == np.int32
    np.testing.assert_array_equal(batch["vec"][5], [5.0, 10.0])
    np.testing.assert_array_equal(batch["grid"][5][1], [1.0, 2.0, 5.0])


def test_tf_dataset_structure_and_transform(spark, cache_dir):
    data = prepare(_numbered(spark, 256), features="x", label="row", cache_dir=cache_dir)

    def double(batch):
        return {**batch, "x": batch["x"] * 2}

    with data.tf_dataset(32, cur_shard=1, shard_count=2, shuffle=False, transform=double) as ds:
        x, y = next(iter(ds))
    assert tuple(x.shape) == (32, 3) and x.dtype.name == "float32"
    np.testing.assert_array_equal(x.numpy()[0], 2 * (np.arange(3) + y.numpy()[0]))
    assert y.numpy()[0] == 128  # shard 1 starts at the middle row


@pytest.mark.parametrize("shuffle", [True, False])
def test_in_memory_and_streaming_feeds_give_the_same_batches(spark, cache_dir, shuffle):
    # 1001 rows in files of 97: shard 1 of 2 (501 rows, wrapping) pads its last batch of 64
    # from the pass's first rows. Both tf_dataset feeds must equal batches(), from a resumed
    # epoch on, across an epoch boundary.
    data = prepare(
        _numbered(spark, 1001), features="x", label="row", cache_dir=cache_dir, rows_per_file=97
    )
    steps = data.steps_per_epoch(64, 2)
    kw = dict(cur_shard=1, shard_count=2, shuffle=shuffle, seed=3, first_epoch=1)
    it = data.batches(64, **kw)
    expected = [next(it)["row"] for _ in range(2 * steps + 1)]
    for in_memory in (True, False):
        with data.tf_dataset(64, in_memory=in_memory, **kw) as ds:
            got = [y.numpy() for _, y in ds.take(2 * steps + 1)]
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
    # The framework-free in-memory feed (hvdrunner.torch's default) too, features included.
    mem, stream = data.batches(64, in_memory=True, **kw), data.batches(64, **kw)
    for _ in range(2 * steps + 1):
        a, b = next(mem), next(stream)
        np.testing.assert_array_equal(a["row"], b["row"])
        np.testing.assert_array_equal(a["x"], b["x"])
    assert len(set(np.concatenate(expected[:steps]).tolist())) == 501  # every row once


def test_prepare_reuses_cache_and_delete_removes_it(spark, tmp_path):
    df = _numbered(spark, 100)
    first = prepare(df, features="x", label="row", cache_dir=str(tmp_path))
    stamp = os.path.getmtime(os.path.join(first.local_path, first.files[0][0]))
    again = prepare(df, features="x", label="row", cache_dir=str(tmp_path))
    assert again == first
    assert os.path.getmtime(os.path.join(first.local_path, first.files[0][0])) == stamp
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]  # nothing half-written
    first.delete()
    assert not os.path.exists(first.local_path)


# -- bad input: a clear error before training ------------------------------------------------
def test_empty_dataframe(spark, cache_dir):
    with pytest.raises(ValueError, match="empty"):
        prepare(_numbered(spark, 10).limit(0), features="x", cache_dir=cache_dir)


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        ("map('k', id)", "'bad' has type map"),
        ("named_struct('a', id)", "'bad' has type struct"),
        ("array(cast(id as string))", "'bad' has type array<string>.*join them in Spark"),
    ],
)
def test_unsupported_column_types_are_named(spark, cache_dir, expr, match):
    df = spark.range(10).selectExpr("id", f"{expr} as bad")
    with pytest.raises(ValueError, match=match):
        prepare(df, features="bad", label="id", cache_dir=cache_dir)


def test_missing_column_and_ragged_and_null(spark, cache_dir):
    df = spark.range(10).selectExpr(
        "id", "sequence(0, id % 3) as ragged", "if(id = 3, null, id) as holes"
    )
    with pytest.raises(ValueError, match="'nope' is not in the DataFrame"):
        prepare(df, features="nope", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="ragged arrays \\(lengths 1..3\\)"):
        prepare(df, features="ragged", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="'holes' has 1 null rows"):
        prepare(df, features="holes", cache_dir=cache_dir)


def test_batch_larger_than_shard(spark, cache_dir):
    data = prepare(_numbered(spark, 100), features="x", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="batch_size=64 is larger than one rank's shard \\(50"):
        data.steps_per_epoch(64, 2)
    with pytest.raises(ValueError, match="batch_size=64"):
        data.batches(64, cur_shard=0, shard_count=2)


def test_unusable_cache_dirs(spark, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="is not writable"):
        prepare(_numbered(spark, 10), features="x", cache_dir=str(blocker / "sub"))
    with pytest.raises(ValueError, match="scheme s3:// is not readable"):
        prepare(_numbered(spark, 10), features="x", cache_dir="s3://bucket/cache_dir")
    # A multi-node master with a node-local directory: ranks elsewhere would not see it.
    with pytest.raises(ValueError, match="cache_dir=.* looks local to each machine"):
        for_ranks(str(tmp_path), "spark://10.0.0.1:7077", False, "cache_dir")
    assert resolve("/dbfs/tmp/x").shared  # accepted on a cluster (resolve writes nothing)


@pytest.mark.parametrize(
    ("given", "url", "local"),
    [
        ("dbfs:/tmp/c", "dbfs:/tmp/c", "/dbfs/tmp/c"),
        ("/dbfs/tmp/c", "dbfs:/tmp/c", "/dbfs/tmp/c"),
        ("file:/dbfs/tmp/c", "dbfs:/tmp/c", "/dbfs/tmp/c"),
        ("file:///dbfs/tmp/c", "dbfs:/tmp/c", "/dbfs/tmp/c"),
        ("/Volumes/main/default/v/c", "/Volumes/main/default/v/c", "/Volumes/main/default/v/c"),
        (
            "dbfs:/Volumes/main/default/v/c",
            "/Volumes/main/default/v/c",
            "/Volumes/main/default/v/c",
        ),
        ("file:///tmp/c", "file:///tmp/c", "/tmp/c"),
        ("/tmp/c", "file:///tmp/c", "/tmp/c"),
    ],
)
def test_path_normalization(given, url, local):
    loc = resolve(given)
    assert (loc.spark_url, loc.local_path) == (url, local)


def call_prepare_in_rank() -> None:
    prepare(None, features="x")


def test_prepare_inside_a_rank_is_refused():
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-1).run(call_prepare_in_rank)
    assert info.value.exc_type == "RuntimeError"
    assert "runs on the driver" in info.value.remote_message


# -- the classic hang, removed: uneven rows, real 2-rank Keras fit -------------------------
def fit_uneven(data, batch_size: int) -> list:
    import tensorflow as tf

    import hvdrunner.hvd_keras as hvd

    hvd.init()
    steps = data.steps_per_epoch(batch_size)
    model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1e-4)), loss="mse")

    class Count(tf.keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch, logs=None):
            Count.batches += 1

    with data.tf_dataset(batch_size) as ds:
        model.fit(
            ds.map(lambda x, y: (x, tf.cast(y, tf.float32))),
            steps_per_epoch=steps,
            epochs=3,
            verbose=0,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Count()],
        )
    return hvd.allgather_object((hvd.rank(), steps, Count.batches))


@pytest.mark.timeout(180)  # the hang this layer removes would stop here, not pass
def test_uneven_rows_real_two_rank_fit_completes(spark, cache_dir):
    data = prepare(
        _numbered(spark, 1001), features="x", label="row", cache_dir=cache_dir, rows_per_file=97
    )
    report = HorovodRunner(np=2).run(fit_uneven, data=data, batch_size=64)
    assert sorted(report) == [(0, 8, 24), (1, 8, 24)]


def test_handle_is_small_and_picklable(spark, cache_dir):
    import cloudpickle

    data = prepare(
        _numbered(spark, 1001), features="x", label="row", cache_dir=cache_dir, rows_per_file=97
    )
    assert len(cloudpickle.dumps(data)) < 10_000
    assert Path(data.local_path).is_dir()


@pytest.mark.parametrize("ranks", [3, 4, 5])
def test_more_than_two_ranks_get_equal_full_steps_and_every_row(spark, cache_dir, ranks):
    data = prepare(
        _numbered(spark, 1003), features="x", label="row", cache_dir=cache_dir, rows_per_file=89
    )
    epochs = [_epoch_rows(data, s, ranks, 32, shuffle=False) for s in range(ranks)]
    assert len({len(e) for e in epochs}) == 1  # equal steps on every rank: nobody waits
    assert set(np.concatenate(epochs).tolist()) == set(range(1003))  # no row dropped


def test_a_crash_while_writing_leaves_no_half_cache(spark, tmp_path, monkeypatch):
    import importlib

    prepare_module = importlib.import_module(
        "hvdrunner.data.prepare"
    )  # the module, not the function

    def crash(path):
        raise OSError("executor lost mid-write")

    monkeypatch.setattr(prepare_module, "file_rows", crash)  # after Spark wrote the files
    with pytest.raises(OSError, match="executor lost mid-write"):
        prepare(_numbered(spark, 100), features="x", label="row", cache_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []  # neither a final folder nor a temporary one
    monkeypatch.undo()
    data = prepare(_numbered(spark, 100), features="x", label="row", cache_dir=str(tmp_path))
    assert data.num_rows == 100  # the next prepare writes it whole
