"""The columns deep learning uses, through ``prepare()`` and the petastorm drop-in: binary
(JPEG bytes) and string columns, Spark ML and MLlib vectors, booleans, token-id arrays
(fixed, or ragged with ``pad=``); a ``TransformSpec`` decoding on the ranks, its every
mistake named at the first batch; and what petastorm does that the drop-in now does too (a
batch larger than a shard, a finite pass counting every row once, ``make_one_shot_iterator``,
booleans as ``uint8`` in torch). Real Spark and Parquet; on lts the same conversions are run
through real petastorm beside the drop-in (tests/test_image_recipes.py trains on them)."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest

from hvdrunner.data import TransformSpec, prepare

# Spark 3.5 + pyarrow 14 (lts) and Spark 4.1 + pyarrow 22 (18) write and read these.
pytestmark = pytest.mark.stacks("15.4", "18")


def jpeg(value: int, size: int = 8) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def table(spark):
    """10 rows of every kind a deep-learning table holds, in 3 partitions."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.mllib.linalg import Vectors as MLlibVectors
    from pyspark.mllib.linalg import VectorUDT as MLlibVectorUDT
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("content", T.BinaryType()), T.StructField("text", T.StringType()),
        T.StructField("label_index", T.IntegerType()), T.StructField("flag", T.BooleanType()),
        T.StructField("ml", VectorUDT()), T.StructField("mllib", MLlibVectorUDT()),
        T.StructField("tokens", T.ArrayType(T.IntegerType())),
        T.StructField("ragged", T.ArrayType(T.LongType())),
    ])  # fmt: skip
    rows = [(jpeg(20 * i), f"row {i}", i % 3, bool(i % 2), Vectors.dense([i, 0.5]),
             MLlibVectors.dense([i, 1.5]), [i, i + 1, i + 2], list(range(1, i % 4 + 2)))
            for i in range(10)]  # fmt: skip
    return spark.createDataFrame(rows, schema).repartition(3)


def decode(frame):
    from PIL import Image

    frame["features"] = frame["content"].map(
        lambda b: np.asarray(Image.open(io.BytesIO(b)), dtype=np.float32) / 255.0
    )
    return frame


IMAGE = TransformSpec(decode, edit_fields=[("features", np.float32, (8, 8, 3), False)],
                      selected_fields=["features", "label_index"])  # fmt: skip


def test_every_kind_is_prepared_with_its_dtype_and_shape(table, tmp_path):
    data = prepare(table, features=["content", "text", "flag", "ml", "mllib", "tokens", "ragged"],
                   label="label_index", cache_dir=str(tmp_path), pad={"ragged": 3})  # fmt: skip
    kinds = {c.name: (c.dtype, c.shape) for c in data.columns}
    assert kinds == {
        "content": ("object", ()), "text": ("object", ()), "flag": ("bool", ()),
        "ml": ("float32", (2,)), "mllib": ("float32", (2,)), "tokens": ("int32", (3,)),
        "ragged": ("int64", (3,)), "label_index": ("int32", ()),
    }  # fmt: skip
    rows = {}
    for batch in data.batches(5, shuffle=False, cur_shard=0, shard_count=1, passes=1):
        for i, index in enumerate(batch["text"]):
            rows[index] = {k: v[i] for k, v in batch.items()}
    assert len(rows) == 10
    row3 = rows["row 3"]
    assert isinstance(row3["content"], bytes) and row3["content"] == jpeg(60)
    assert row3["mllib"].tolist() == [3.0, 1.5] and row3["ml"].tolist() == [3.0, 0.5]
    assert row3["ragged"].tolist() == [1, 2, 3]  # 4 long (3 % 4 + 1 = 4): cut to 3
    assert rows["row 0"]["ragged"].tolist() == [1, 0, 0]  # padded with 0
    # JPEGs are stored as they are: the cache is about the size of the bytes, not of pixels.
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*.parquet"))
    assert on_disk < 10 * len(jpeg(0)) * 3


def test_ragged_arrays_name_the_pad_option_and_nulls_are_refused(spark, tmp_path):
    df = spark.createDataFrame([([1, 2], b"x"), ([1], b"y")], "tokens array<int>, content binary")
    with pytest.raises(ValueError, match=r"ragged arrays \(lengths 1\.\.2\).*pad=\{'tokens'"):
        prepare(df, features="tokens", cache_dir=str(tmp_path))
    nulls = spark.createDataFrame([(b"x",), (None,)], "content binary")
    with pytest.raises(ValueError, match="column 'content' has 1 null rows"):
        prepare(nulls, features="content", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="pad names 'content'"):
        prepare(df, features=["tokens", "content"], pad={"content": 4}, cache_dir=str(tmp_path))


def test_a_transform_decodes_on_the_rank_in_threads_ahead_of_the_model(table, tmp_path):
    data = prepare(table, features=["content"], label="label_index", cache_dir=str(tmp_path))
    seen = set()

    def slow_decode(frame):
        seen.add(threading.current_thread().name)
        time.sleep(0.05)
        return decode(frame)

    spec = TransformSpec(slow_decode, edit_fields=[("features", np.float32, (8, 8, 3), False)],
                         selected_fields=["features", "label_index"])  # fmt: skip
    images = data.transformed(spec, "features", "label_index", workers=3)
    feed = images.batches(2, cur_shard=0, shard_count=1)
    batches = [next(feed) for _ in range(10)]
    feed.close()
    x, y = images.structure(batches[0])
    assert x.shape == (2, 8, 8, 3) and x.dtype == np.float32 and y.dtype == np.int32
    assert len({t for t in seen if t.startswith("hvdrunner-read")}) >= 2  # pieces decoded at once
    # The same rows as the feed without the transform, in the same order.
    plain = data.batches(2, cur_shard=0, shard_count=1)
    for batch in batches[:5]:
        assert np.array_equal(batch["label_index"], next(plain)["label_index"])
    plain.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("hvdrunner-read")]


@pytest.mark.parametrize("spec,message", [
    (TransformSpec(decode, edit_fields=[("features", np.float32, (8, 8), False)]),
     "column 'features' has a row of shape (8, 8, 3); edit_fields declares (8, 8)"),
    (TransformSpec(decode, edit_fields=[("features", np.float64, (8, 8, 3), False)]),
     "column 'features' is float32; edit_fields declares float64"),
    (TransformSpec(decode, selected_fields=["features"]),
     "column 'features' is made by the transform but not declared"),
    (TransformSpec(lambda f: f.head(1), edit_fields=[]),
     "returned 1 rows for 10: it must keep every row"),  # a whole piece: one file of 10 rows
    (TransformSpec(lambda f: f.assign(label_index=f.label_index.astype("int64"))),
     "column 'label_index' is int64; its input column (not in edit_fields) declares int32"),
    (TransformSpec(lambda f: f[["label_index"]], selected_fields=["content"]),
     "names column 'content', but the transform's output has only ['label_index']"),
    (TransformSpec(lambda f: f.to_dict()), "returned dict, not a pandas DataFrame"),
])  # fmt: skip
def test_a_wrong_transform_fails_at_the_first_batch_naming_the_column(table, tmp_path, spec,
                                                                       message):  # fmt: skip
    data = prepare(table, features=["content"], label="label_index", cache_dir=str(tmp_path))
    names = spec.output_names(["content", "label_index"])
    feed = data.transformed(spec, [names[0]]).batches(4, cur_shard=0, shard_count=1)
    with pytest.raises((ValueError, TypeError)) as info:
        next(feed)
    assert message in str(info.value)


def test_a_finite_pass_counts_every_row_once_and_training_stays_equal(table, tmp_path):
    data = prepare(table, features=["text"], label="label_index", cache_dir=str(tmp_path))
    seen = []
    for shard in range(4):
        sizes = [len(b["text"]) for b in data.batches(3, cur_shard=shard, shard_count=4, passes=1)]
        seen.append(sizes)
        assert all(n <= 3 for n in sizes)
    assert seen == [[3], [3], [2], [2]]  # balanced, one batch on every shard (equal steps)
    rows = [t for shard in range(4)
            for b in data.batches(3, cur_shard=shard, shard_count=4, passes=1) for t in b["text"]]  # fmt: skip
    assert sorted(rows) == sorted(f"row {i}" for i in range(10))
    # Training (endless): every shard runs the same steps of full batches.
    for shard in range(4):
        feed = data.batches(3, cur_shard=shard, shard_count=4)
        assert len(next(feed)["text"]) == 3
        feed.close()


def test_shards_are_equal_even_with_more_shards_than_a_row_each(spark, tmp_path):
    data = prepare(spark.range(5).repartition(2), features="id", cache_dir=str(tmp_path))
    assert [data.steps_per_epoch(2, 4)] == [1]
    for shard in range(4):
        feed = data.batches(2, cur_shard=shard, shard_count=4)
        assert len(next(feed)["id"]) == 2
        feed.close()


# -- the petastorm drop-in -------------------------------------------------------------------
@pytest.fixture()
def converter(spark, table, tmp_path):
    from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}")
    try:
        yield make_spark_converter(table.select("content", "text", "label_index", "flag", "mllib"))
    finally:
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


@pytest.mark.keras
def test_the_drop_ins_tf_dataset_decodes_with_a_transform_spec(converter):
    from hvdrunner.petastorm import TransformSpec as DropIn

    assert DropIn is TransformSpec
    with converter.make_tf_dataset(transform_spec=IMAGE, batch_size=4, cur_shard=0,
                                   shard_count=2) as ds:  # fmt: skip
        batch = next(iter(ds))
        assert batch._fields == ("features", "label_index")
        assert tuple(batch.features.shape) == (4, 8, 8, 3)
        assert hasattr(ds, "make_one_shot_iterator")  # petastorm's tf.compat.v1 dataset


@pytest.mark.keras
def test_the_drop_in_gives_small_shards_and_finite_passes_as_petastorm_does(spark, tmp_path):
    from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}")
    try:
        converter = make_spark_converter(spark.range(10))
        with converter.make_tf_dataset(cur_shard=0, shard_count=1) as ds:  # batch 32 > 10 rows
            assert next(iter(ds)).id.shape[0] == 32
        with converter.make_tf_dataset(
            batch_size=4, num_epochs=1, cur_shard=0, shard_count=1
        ) as ds:
            assert [int(b.id.shape[0]) for b in ds] == [4, 4, 2]  # petastorm: 4 + 4 + 2
        val = make_spark_converter(spark.range(100))  # 100 rows over 4 ranks at batch 30
        counts = []
        for shard in range(4):
            with val.make_tf_dataset(batch_size=30, num_epochs=1, cur_shard=shard,
                                     shard_count=4) as ds:  # fmt: skip
                counts.append(sum(int(b.id.shape[0]) for b in ds))
        assert counts == [25, 25, 25, 25]
    finally:
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


@pytest.mark.torch
@pytest.mark.stacks("19")
def test_the_drop_ins_torch_loader_types_as_petastorm(spark, tmp_path):
    from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter

    df = spark.createDataFrame([(True, b"a", 1), (False, b"b", 2)] * 4,
                               "flag boolean, content binary, label int")  # fmt: skip
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}")
    try:
        converter = make_spark_converter(df)
        with converter.make_torch_dataloader(batch_size=4, cur_shard=0, shard_count=1,
                                             schema_fields=["flag", "label"],
                                             shuffle_row_groups=False) as loader:  # fmt: skip
            batch = next(iter(loader))
        import torch

        assert batch["flag"].dtype == torch.uint8  # petastorm's: 1 - x and x + x mean numbers
        assert (1 - batch["flag"]).tolist() == [0, 1, 0, 1]
        with (
            converter.make_torch_dataloader(batch_size=4, cur_shard=0, shard_count=1) as loader,
            pytest.raises(TypeError, match="Found in field 'content': decode it on the ranks"),
        ):
            next(iter(loader))
    finally:
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


def _plain(value):
    return value.tolist() if hasattr(value, "tolist") else value


@pytest.mark.keras
@pytest.mark.stacks("15.4")
@pytest.mark.timeout(300)
def test_every_kind_reads_as_real_petastorm_reads_it(spark, table, tmp_path):
    """The same DataFrame through petastorm 0.13.1 and the drop-in: the same columns, dtypes,
    shapes and values (one pass, one shard, unshuffled)."""
    import petastorm.spark as real

    from hvdrunner.petastorm import spark as ours

    df = table.select("content", "text", "label_index", "flag", "ml", "mllib", "tokens")
    got = {}
    for name, module in (("real", real), ("ours", ours)):
        spark.conf.set(
            module.SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}/{name}"
        )
        converter = module.make_spark_converter(df)
        rows = {}
        with converter.make_tf_dataset(batch_size=4, num_epochs=1, shuffle_row_groups=False,
                                       workers_count=1) as ds:  # fmt: skip
            for batch in ds:
                cols = batch._asdict()
                for i, text in enumerate(cols["text"].numpy()):
                    rows[text] = {k: (v.dtype.name, tuple(v.shape[1:]), _plain(v.numpy()[i]))
                                  for k, v in cols.items()}  # fmt: skip
        got[name] = rows
        converter.delete()
    spark.conf.unset(real.SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
    assert got["ours"] == got["real"]


def test_the_same_columns_prepared_again_in_other_roles_get_those_roles(table, tmp_path):
    both = prepare(table, features=["content", "label_index"], cache_dir=str(tmp_path))
    labelled = prepare(table, features="content", label="label_index", cache_dir=str(tmp_path))
    assert labelled.local_path == both.local_path  # the same files, reused
    assert (both.features, both.label) == (("content", "label_index"), None)
    assert (labelled.features, labelled.label, labelled.single_feature) == (
        ("content",), "label_index", True)  # fmt: skip


# -- hostile input (issue 51) -----------------------------------------------------------------
def test_a_transform_row_of_another_dtype_is_refused_not_widened():
    """A float64 row among float32 ones: np.stack would make the batch float64 while
    edit_fields says float32. Every row is checked, the row named."""
    from hvdrunner.data.transform import apply

    def mixed(df):
        return df.assign(x=[np.zeros(2, np.float32), np.zeros(2, np.float64),
                            np.zeros(2, np.float32)])  # fmt: skip

    spec = TransformSpec(mixed, edit_fields=[("x", np.float32, (2,), False)])
    with pytest.raises(ValueError, match=r"column 'x' has a row of float64 \(row 1 of the "
                       r"batch\); edit_fields declares float32"):  # fmt: skip
        apply(spec, {"x": np.zeros(3, np.float32)})


def test_petastorms_string_and_bytes_declarations_are_accepted():
    from hvdrunner.data.transform import apply

    spec = TransformSpec(lambda df: df.assign(s=df.b.map(lambda v: v.decode()), t=df.b),
                         edit_fields=[("s", np.str_, (), False), ("t", np.bytes_, (), False)])  # fmt: skip
    out = apply(spec, {"b": np.array([b"cat", b"dog"], dtype=object)})
    assert out["s"].tolist() == ["cat", "dog"] and out["t"].tolist() == [b"cat", b"dog"]
    wrong = TransformSpec(lambda df: df.assign(s=df.b), edit_fields=[("s", np.str_, (), False)])
    with pytest.raises(ValueError, match=r"column 's' holds bytes; edit_fields declares np.str_"):
        apply(wrong, {"b": np.array([b"cat", b"dog"], dtype=object)})
    numbers = TransformSpec(lambda df: df.assign(n=df.b), edit_fields=[("n", np.int32, (), False)])
    with pytest.raises(ValueError, match=r"declare np.str_, np.bytes_ or object"):
        apply(numbers, {"b": np.array([b"cat", b"dog"], dtype=object)})


def test_a_dotted_column_name_is_refused_naming_the_rename(spark, tmp_path):
    df = spark.createDataFrame([(1.0, 0)], "`a.b` double, label int")
    with pytest.raises(ValueError, match=r"column 'a.b' has a dot in its name.*"
                       r"withColumnRenamed\('a.b', 'a_b'\)"):  # fmt: skip
        prepare(df, features=["a.b"], label="label", cache_dir=str(tmp_path))


def test_a_null_or_ragged_vector_is_refused_by_name_with_advice_that_works(spark, tmp_path):
    """A null vector gave Spark's raw Py4JJavaError (vector_to_array's), without the column;
    vectors of different sizes were told to use pad=, which refuses vectors."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("v", VectorUDT(), True),
                           T.StructField("label", T.IntegerType())])  # fmt: skip
    null = spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 0), (None, 1)], schema)
    with pytest.raises(ValueError, match=r"column 'v' has 1 null rows; fill them"):
        prepare(null, features="v", label="label", cache_dir=str(tmp_path))
    ragged = spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 0), (Vectors.dense([1.0]), 1)],
                                   schema)  # fmt: skip
    with pytest.raises(ValueError, match=r"column 'v' holds ML vectors of different sizes") as err:
        prepare(ragged, features="v", label="label", cache_dir=str(tmp_path))
    assert "pad" not in str(err.value)


@pytest.mark.keras
def test_a_field_of_variable_length_gives_each_batch_its_own_width(spark, tmp_path):
    """edit_fields ("tokens", np.int64, (None,)): the transform pads each batch to its own
    longest row, as petastorm allows; the dataset's signature leaves that axis open and a
    finite pass never joins batches of different widths (both failed before issue 51)."""
    from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter

    words = [" ".join(["w"] * (1 + i % 6)) for i in range(24)]
    df = spark.createDataFrame([(t, i) for i, t in enumerate(words)], "text string, row long")

    def tokenize(pdf):
        ids = [np.arange(1, len(t.split()) + 1, dtype=np.int64) for t in pdf.text]
        width = max(len(a) for a in ids)
        return pdf.assign(tokens=[np.pad(a, (0, width - len(a))) for a in ids])

    spec = TransformSpec(tokenize, edit_fields=[("tokens", np.int64, (None,), False)],
                         selected_fields=["tokens", "row"])  # fmt: skip
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}")
    try:
        converter = make_spark_converter(df.repartition(3))
        with converter.make_tf_dataset(transform_spec=spec, batch_size=4, num_epochs=1,
                                       cur_shard=0, shard_count=1) as ds:  # fmt: skip
            assert ds.element_spec.tokens.shape.as_list() == [None, None]
            batches = [(b.tokens.numpy(), b.row.numpy()) for b in ds]
        rows = sorted(int(r) for _, rs in batches for r in rs)
        assert rows == list(range(24))  # every row once
        widths = {t.shape[1] for t, _ in batches}
        assert len(widths) > 1, widths  # batches differ in width
        for tokens, rs in batches:  # each row's own tokens, padded to its batch's width
            for t, r in zip(tokens, rs, strict=True):
                n = 1 + int(r) % 6
                assert t[:n].tolist() == list(range(1, n + 1)) and not t[n:].any()
    finally:
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
