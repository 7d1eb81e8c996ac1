"""hvdrunner.data never trains on stale or silently corrupted input (real Spark, real files):
the cache follows its input, array contents are validated, broken caches are rebuilt or
refused with the fix, and a rank that cannot see the files fails naming the path."""

from __future__ import annotations

import os

import numpy as np
import pytest

from hvdrunner import HorovodRunner, HorovodRunnerError
from hvdrunner.data import prepare
from hvdrunner.data.reader import CorruptDataError

# Freshness and integrity read Spark's and pyarrow's metadata, which differ between the TF
# stacks (tests/conftest.py).
pytestmark = pytest.mark.stacks("15.4", "18")


def _write_source(spark, path, n: int, mode: str = "overwrite", start: int = 0) -> None:
    from pyspark.sql import functions as F

    df = spark.range(start, start + n).select(
        F.array(F.col("id").cast("double"), F.lit(1.0)).alias("x"), F.col("id").alias("y")
    )
    df.write.mode(mode).parquet(str(path))


def test_cache_follows_overwrite_and_append_of_the_source(spark, tmp_path, capsys):
    src, cache = tmp_path / "src", str(tmp_path / "cache")
    _write_source(spark, src, 100)
    first = prepare(spark.read.parquet(str(src)), features="x", label="y", cache_dir=cache)
    again = prepare(spark.read.parquet(str(src)), features="x", label="y", cache_dir=cache)
    assert again.local_path == first.local_path and again.num_rows == 100
    assert "reusing prepared data" in capsys.readouterr().err
    _write_source(spark, src, 300)  # overwritten: 300 rows now
    over = prepare(spark.read.parquet(str(src)), features="x", label="y", cache_dir=cache)
    assert over.num_rows == 300 and over.local_path != first.local_path
    _write_source(spark, src, 100, mode="append", start=300)
    appended = prepare(spark.read.parquet(str(src)), features="x", label="y", cache_dir=cache)
    assert appended.num_rows == 400
    assert appended.local_path not in (first.local_path, over.local_path)


def test_refresh_rewrites_even_when_unchanged(spark, tmp_path, capsys):
    src, cache = tmp_path / "src", str(tmp_path / "cache")
    _write_source(spark, src, 50)
    prepare(spark.read.parquet(str(src)), features="x", label="y", cache_dir=cache)
    capsys.readouterr()
    prepare(spark.read.parquet(str(src)), features="x", label="y", cache_dir=cache, refresh=True)
    err = capsys.readouterr().err
    assert "writing 50 rows" in err and "reusing" not in err


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        ("array(cast(id as double), cast(null as double))", "null elements inside their arrays"),
        ("array(id, cast(null as bigint))", "null elements inside their arrays"),
        ("array(array(1.0, 2.0), cast(null as array<double>))", "null elements"),
        # equal totals (4 values) but different nesting: must not be reshaped silently
        ("if(id % 2 = 0, array(array(1.0, 2.0, 3.0, 4.0)), array(array(1.0, 2.0), array(3.0, 4.0)))",
         "nested arrays of unequal shape"),
        ("if(id % 2 = 0, array(array(1.0, 2.0), array(3.0)), array(array(1.0), array(2.0, 3.0)))",
         "nested arrays of unequal shape"),
    ],
)  # fmt: skip
def test_array_contents_are_validated_naming_the_column(spark, tmp_path, expr, match):
    df = spark.range(10).selectExpr(f"{expr} as x", "id as y")
    with pytest.raises(ValueError, match=f"column 'x'.*{match}"):
        prepare(df, features="x", label="y", cache_dir=str(tmp_path))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "float16"}, r"dtype float16 is not supported\. Use 'float32' or float64"),
        ({"cache_dir": ""}, "cache_dir='' is empty"),
        ({"cache_dir": "   "}, "is empty"),
    ],
)
def test_bad_options_fail_before_any_spark_job(spark, kwargs, match):
    df = spark.range(4).selectExpr("array(1.0, 2.0) as x", "id as y")
    with pytest.raises(ValueError, match=match):
        prepare(df, features="x", label="y", **kwargs)


def _prepared(spark, tmp_path, n: int = 200):
    df = spark.range(n).selectExpr("array(cast(id as double), 1.0) as x", "id as y")
    return prepare(df, features="x", label="y", cache_dir=str(tmp_path / "cache"), rows_per_file=50)


@pytest.mark.parametrize("victim", ["parquet", "meta"])
def test_a_damaged_cache_is_rebuilt_not_reused(spark, tmp_path, capsys, victim):
    data = _prepared(spark, tmp_path)
    if victim == "meta":
        target = os.path.join(data.local_path, "_hvdrunner_meta.json")
    else:
        target = os.path.join(data.local_path, data.files[0][0])
    with open(target, "r+b") as f:
        f.truncate(os.path.getsize(target) // 2)
    rebuilt = _prepared(spark, tmp_path)
    assert "is damaged" in capsys.readouterr().err
    assert rebuilt.num_rows == 200
    rows = np.concatenate(
        [
            b["y"]
            for b, _ in zip(
                rebuilt.batches(50, cur_shard=0, shard_count=1, shuffle=False),
                range(4),
                strict=False,
            )
        ]  # fmt: skip
    )
    assert sorted(rows.tolist()) == list(range(200))


def test_a_file_damaged_after_prepare_fails_in_the_rank_naming_it(spark, tmp_path):
    data = _prepared(spark, tmp_path)
    target = os.path.join(data.local_path, data.files[0][0])
    with open(target, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CorruptDataError, match="refresh=True") as info:
        next(data.batches(10, cur_shard=0, shard_count=1, shuffle=False))
    assert target in str(info.value)


def read_one_batch(data) -> int:
    return len(next(data.batches(10, shuffle=False))["y"])


def test_a_rank_that_cannot_see_the_files_fails_fast_naming_the_path(spark, tmp_path):
    import dataclasses

    data = _prepared(spark, tmp_path)
    elsewhere = dataclasses.replace(data, local_path=str(tmp_path / "not-mounted-here"))
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2).run(read_one_batch, data=elsewhere)
    assert "cannot see the prepared data" in (info.value.remote_message or "")
    assert str(tmp_path / "not-mounted-here") in (info.value.remote_message or "")
    assert HorovodRunner(np=-2).run(read_one_batch, data=data) == 10


def test_shared_opt_in_for_non_databricks_clusters(spark, tmp_path):
    from hvdrunner._paths import for_ranks

    with pytest.raises(ValueError, match="shared=True"):
        for_ranks(str(tmp_path), "spark://10.0.0.1:7077", False, "cache_dir")
    loc = for_ranks(str(tmp_path), "spark://10.0.0.1:7077", True, "cache_dir")
    assert loc.local_path == str(tmp_path)
