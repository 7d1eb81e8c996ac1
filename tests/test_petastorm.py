"""hvdrunner.petastorm: petastorm's converter API on the data layer, with real Spark writes,
real Parquet reads and (tests/test_petastorm_recipes.py) real Horovod ranks. On lts, where
petastorm 0.13.1 imports, the real converter is run beside it for the facts it is compared on."""

from __future__ import annotations

import os
from collections import Counter

import pyarrow.parquet as pq
import pytest

from hvdrunner.errors import CorruptDataError
from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter

CONF = SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF
# The converter's write and read are the data layer's: Spark 3.5 + pyarrow 14 on lts, Spark
# 4.1 + pyarrow 22 on 18 (19's too; tests/conftest.py). The torch loader's
# own test runs on torch.
data_layer = pytest.mark.stacks("15.4", "18")


@pytest.fixture()
def parent(spark, tmp_path):
    """The parent cache dir conf, set as Databricks' notebooks set it; unset afterwards."""
    url = f"file://{tmp_path}/petastorm-cache"
    spark.conf.set(CONF, url)
    yield url
    spark.conf.unset(CONF)


def _frame(spark, n: int, partitions: int = 7):
    """``n`` rows: a row id, a 3-double array, a double, an int; unevenly partitioned."""
    from pyspark.sql import functions as F

    return (
        spark.range(n)
        .select(
            F.col("id").alias("row"),
            F.array(*[F.col("id").cast("double") + i for i in range(3)]).alias("features"),
            (F.col("id") % 10).cast("double").alias("weight"),
            (F.col("id") % 10).cast("int").alias("label"),
        )
        .repartition(partitions)
    )


def _tf_rows(converter, shard: int, count: int, **kw) -> tuple[list[int], list[int]]:
    """Row ids per batch and batch sizes of one shard's finite dataset."""
    with converter.make_tf_dataset(cur_shard=shard, shard_count=count, **kw) as ds:
        batches = [b.row.numpy() for b in ds]
    return [int(r) for b in batches for r in b], [len(b) for b in batches]


@data_layer
def test_the_converter_has_petastorms_attributes_and_files(spark, parent):
    converter = make_spark_converter(_frame(spark, 101))
    assert len(converter) == converter.dataset_size == 101
    assert converter.cache_dir_url.startswith(parent)
    paths = [u.replace("file://", "") for u in converter.file_urls]
    assert paths and all(os.path.isfile(p) for p in paths)
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in paths) == 101
    converter.delete()
    assert not any(os.path.exists(p) for p in paths)
    converter.delete()  # twice is fine, as petastorm's


@data_layer
@pytest.mark.parametrize("rows,count", [(101, 2), (101, 3), (1000, 3), (96, 3)])
def test_finite_epochs_count_every_row_once_with_equal_steps_on_every_shard(spark, parent, rows,
                                                                            count):  # fmt: skip
    converter = make_spark_converter(_frame(spark, rows))
    per = [_tf_rows(converter, s, count, batch_size=16, num_epochs=2) for s in range(count)]
    steps = {len(sizes) for _, sizes in per}
    assert len(steps) == 1  # the same steps on every shard: a collective per batch is safe
    for _, sizes in per:  # full batches, then what is left (petastorm's last batch)
        assert all(n == 16 for n in sizes[: len(sizes) // 2 - 1])
        assert 1 <= sizes[len(sizes) // 2 - 1] <= 17
    seen = Counter(r for ids, _ in per for r in ids)
    assert seen == Counter({r: 2 for r in range(rows)})  # every row once per epoch, none twice
    converter.delete()


@data_layer
def test_batches_are_namedtuples_of_every_column_with_petastorms_dtypes(spark, parent):
    converter = make_spark_converter(_frame(spark, 64))
    with converter.make_tf_dataset(batch_size=8) as ds:  # no shards: the whole data set
        batch = next(iter(ds))
    assert type(batch).__name__ == "inferred_schema_view"
    assert batch._fields == ("row", "features", "weight", "label")
    assert batch.features.shape == (8, 3) and batch.features.dtype.name == "float32"
    assert batch.weight.dtype.name == "float32"  # dtype='float32' casts doubles (petastorm's)
    assert (batch.row.dtype.name, batch.label.dtype.name) == ("int64", "int32")
    # the Databricks recipes' first line inside the context
    x, y = next(iter(ds.map(lambda b: (b.features, b.label))))
    assert x.shape == (8, 3) and y.shape == (8,)
    with converter.make_tf_dataset(batch_size=8, schema_fields=["label", "row"]) as ds:
        assert next(iter(ds))._fields == ("row", "label")  # the DataFrame's order
    converter.delete()


@data_layer
def test_shuffle_follows_petastorms_switches_and_is_seeded(spark, parent):
    converter = make_spark_converter(_frame(spark, 200, partitions=1))
    kw = {"batch_size": 20, "num_epochs": 1}
    plain, _ = _tf_rows(converter, 0, 1, shuffle_row_groups=False, **kw)
    assert plain == list(range(200))  # no shuffle asked for: the written order
    shuffled, _ = _tf_rows(converter, 0, 1, **kw)  # petastorm's default shuffles
    assert shuffled != plain and sorted(shuffled) == plain
    assert _tf_rows(converter, 0, 1, **kw)[0] == shuffled  # seed None: seed 0, reproducible
    assert _tf_rows(converter, 0, 1, seed=7, **kw)[0] != shuffled
    queue, _ = _tf_rows(converter, 0, 1, shuffle_row_groups=False,
                        shuffling_queue_capacity=100, **kw)  # fmt: skip
    assert queue != plain  # a shuffling queue shuffles too
    converter.delete()


@data_layer
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"predicate": object()}, r"predicate= .* filter the DataFrame in Spark"),
        ({"cache_location": "/tmp"}, r"cache_location= .* no local disk cache"),
        ({"shard_seed": 3}, r"shard_seed= .* nothing to seed"),
        ({"reader_pool_type": "process"}, r"reader_pool_type='process' is not offered"),
        ({"cur_shard": 0}, r"cur_shard=0 and shard_count=None: pass both"),
        ({"cur_shard": 2, "shard_count": 2}, r"cur_shard=2 must be in \[0, shard_count=2\)"),
        ({"schema_fields": ["nope"]}, r"schema_fields names \['nope'\]"),
        ({"schema_fields": ["row.*"]}, r"schema_fields names \['row.\*'\]"),
        ({"num_epochs": 0}, r"num_epochs=0 must be an int >= 1"),
        ({"workers_count": 0}, r"workers_count=0 must be an int >= 1"),
    ],
)  # fmt: skip
def test_arguments_it_cannot_honour_are_refused_by_name(spark, parent, kwargs, match):
    converter = make_spark_converter(_frame(spark, 50))
    try:
        with pytest.raises(ValueError, match=match):
            open_feed(converter, **kwargs)
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'shuffle_rowgroups'"):
            open_feed(converter, shuffle_rowgroups=True)  # a typo is a TypeError, as in Python
    finally:
        converter.delete()


def open_feed(converter, **kwargs):
    """The first batch of the converter's TF dataset (the torch loader: its own test)."""
    with converter.make_tf_dataset(**kwargs) as ds:
        return next(iter(ds))


@data_layer
def test_make_spark_converter_refuses_what_it_cannot_write(spark, parent):
    from pyspark.sql import functions as F

    df = _frame(spark, 20)
    with pytest.raises(ValueError, match=r"compression_codec='zip': pass None or one of"):
        make_spark_converter(df, compression_codec="zip")
    with pytest.raises(
        ValueError, match=r"dtype float16 is not supported\. Use 'float32' or float64"
    ):
        make_spark_converter(df, dtype="float16")
    with pytest.raises(ValueError, match=r"column 'name' has type map<string,bigint>"):
        make_spark_converter(df.withColumn("name", F.create_map(F.lit("x"), F.col("row"))))
    with pytest.raises(ValueError, match=r"column 'weight' has 20 null rows"):
        make_spark_converter(df.withColumn("weight", F.lit(None).cast("double")))
    converter = make_spark_converter(df)
    with pytest.raises(ValueError, match=r"data_loader_fn= is not offered"):
        converter.make_torch_dataloader(data_loader_fn=list)
    converter.delete()
    spark.conf.unset(CONF)
    with pytest.raises(
        ValueError, match=r"Please set the spark config " + CONF.replace(".", r"\.")
    ):
        make_spark_converter(df)


@data_layer
def test_storage_options_are_honoured(spark, parent):
    df = _frame(spark, 3000, partitions=1)
    default = make_spark_converter(df)
    gz = make_spark_converter(df, compression_codec="gzip", parquet_row_group_size_bytes=4096,
                              dtype=None)  # fmt: skip
    assert default.cache_dir_url != gz.cache_dir_url  # other options, other files

    def meta(converter):
        return pq.ParquetFile(converter.file_urls[0].replace("file://", "")).metadata

    assert meta(default).row_group(0).column(0).compression == "UNCOMPRESSED"  # petastorm's
    assert meta(gz).row_group(0).column(0).compression == "GZIP"
    assert meta(default).num_row_groups == 1 and meta(gz).num_row_groups > 1
    kinds = {c.name: c.dtype for c in gz.prepared("features", "weight").columns}
    assert kinds == {"features": "float64", "weight": "float64"}  # dtype=None keeps doubles
    default.delete()
    gz.delete()


@data_layer
def test_same_data_same_cache_and_a_changed_input_is_written_again(spark, parent, tmp_path):
    src = str(tmp_path / "input")
    _frame(spark, 40).write.parquet(src)
    first = make_spark_converter(spark.read.parquet(src))
    assert make_spark_converter(spark.read.parquet(src)).cache_dir_url == first.cache_dir_url
    assert make_spark_converter(src).cache_dir_url == first.cache_dir_url  # a path, as petastorm
    _frame(spark, 41).write.mode("overwrite").parquet(src)  # the table changed under the path
    second = make_spark_converter(spark.read.parquet(src))
    assert second.cache_dir_url != first.cache_dir_url and len(second) == 41
    first.delete()
    second.delete()


@data_layer
def test_a_damaged_cache_file_fails_loudly_naming_it(spark, parent):
    converter = make_spark_converter(_frame(spark, 64, partitions=1))
    path = converter.file_urls[0].replace("file://", "")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CorruptDataError, match=r"cannot be read .* refresh=True"):
        open_feed(converter, batch_size=8, shuffle_row_groups=False)
    converter.delete()


@pytest.mark.stacks("15.4")
def test_real_petastorm_gives_unequal_shards_where_the_drop_in_gives_equal_ones(spark, parent):
    # What the drop-in fixes, shown on the one stack where petastorm imports: row-group
    # shards of an unevenly partitioned DataFrame hold different row counts, so with a finite
    # num_epochs the ranks would stop at different steps (and Horovod hang).
    from petastorm.spark import make_spark_converter as real_converter

    df = _frame(spark, 1001, partitions=7)
    real = real_converter(df)
    try:
        real_sizes = []
        for shard in range(2):
            with real.make_tf_dataset(batch_size=1001, num_epochs=1, cur_shard=shard,
                                      shard_count=2) as ds:  # fmt: skip
                real_sizes.append(sum(len(b.row) for b in ds))
    finally:
        real.delete()
    assert sum(real_sizes) == 1001 and real_sizes[0] != real_sizes[1]
    ours = make_spark_converter(df)
    got = [_tf_rows(ours, s, 2, batch_size=50, num_epochs=1) for s in range(2)]
    # The same steps on both shards (10 of 50, then what is left: 51 and 50), every row once.
    assert [sizes for _, sizes in got] == [[50] * 9 + [51], [50] * 10]
    assert sorted(r for ids, _ in got for r in ids) == list(range(1001))
    ours.delete()


@pytest.mark.torch
def test_the_torch_loader_gives_dicts_of_tensors_and_equal_batches(spark, parent):
    import torch

    converter = make_spark_converter(_frame(spark, 101))
    counts = []
    for shard in range(3):
        with converter.make_torch_dataloader(batch_size=16, num_epochs=1, cur_shard=shard,
                                             shard_count=3) as loader:  # fmt: skip
            batches = list(loader)
            again = list(loader)  # a new pass: the next epoch's order
        counts.append(len(batches))
        first = batches[0]
        assert sorted(first) == ["features", "label", "row", "weight"]
        assert first["features"].shape == (16, 3) and first["features"].dtype == torch.float32
        assert first["label"].dtype == torch.int32 and first["row"].dtype == torch.int64
        assert len(again) == len(batches)
        assert [b["row"].tolist() for b in again] != [b["row"].tolist() for b in batches]
    assert counts == [3, 3, 3]  # ceil(ceil(101 / 3) / 16) on every shard
    with converter.make_torch_dataloader(batch_size=16) as loader:  # endless by default
        it = iter(loader)
        assert len([next(it) for _ in range(20)]) == 20  # past one pass (7 batches)
        # A second iter() would start again at the first epoch's order: refused, in
        # petastorm's words (issue 51).
        with pytest.raises(RuntimeError, match="Cannot start a new iteration because last "
                           "time iteration did not finish.*num_epochs=N"):  # fmt: skip
            iter(loader)
    converter.delete()
    with pytest.raises(ValueError, match=r"deleted \(converter.delete\(\)\).*make_spark_converter"):
        converter.make_torch_dataloader(batch_size=16)


def test_reader_arguments_map_onto_the_read_options(monkeypatch, caplog):
    from hvdrunner.petastorm.options import read_options

    opts = read_options(["row", "x"], None, 3, 5, None, {"cur_shard": 1, "shard_count": 4,
                                                        "seed": 9, "schema_fields": ["x"]})  # fmt: skip
    assert (opts.batch_size, opts.num_epochs, opts.read_ahead) == (32, 3, 5)  # petastorm's 32
    assert (opts.cur_shard, opts.shard_count, opts.seed, opts.fields) == (1, 4, 9, ("x",))
    assert read_options(["x"], 8, None, None, 0, {"shuffle_row_groups": False}).shuffle is False
    assert read_options(["x"], 8, None, None, 0, {"shuffle_rows": True,
                                                  "shuffle_row_groups": False}).shuffle  # fmt: skip
    assert read_options(["x"], 8, None, None, 0, {"reader_pool_type": "thread",
                                                  "cache_type": "null"}).shuffle  # fmt: skip
    # No shards inside a job of 2 ranks: every rank reads everything, as petastorm - said.
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    with caplog.at_level("WARNING", logger="hvdrunner"):
        whole = read_options(["x"], 8, None, None, None, {})
    assert (whole.cur_shard, whole.shard_count) == (0, 1)
    assert "every rank reads the whole data set" in caplog.text
