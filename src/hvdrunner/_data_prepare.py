"""Driver side of ``hvdrunner.data.prepare``: validate, write Parquet atomically, describe it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from hvdrunner import _paths
from hvdrunner._data_reader import Column
from hvdrunner.data import _FORMAT, _META, PreparedData

_TARGET_FILE_BYTES = 16 * 1024 * 1024
_UNSUPPORTED_HINT = {
    "StringType": "encode it as a number first (e.g. pyspark.ml.feature.StringIndexer)",
    "MapType": "select the needed keys into numeric columns",
    "StructType": "select its numeric fields as separate columns",
    "BinaryType": "decode it in Spark into a numeric array column",
}


def _say(msg: str) -> None:
    print(f"[hvdrunner.data] {msg}", file=sys.stderr, flush=True)


def _check_driver() -> None:
    from pyspark import TaskContext

    if TaskContext.get() is not None or "HOROVOD_RANK" in os.environ:
        raise RuntimeError(
            "hvdrunner.data.prepare() runs on the driver: it launches Spark jobs. Call it "
            "before HorovodRunner.run() and pass the returned handle to your function."
        )


def _column_kind(name: str, dtype: Any) -> tuple[str, int]:
    """('scalar'|'array'|'vector', array depth) or ValueError naming the column."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    numeric = (T.NumericType, T.BooleanType)
    if isinstance(dtype, numeric):
        return "scalar", 0
    if isinstance(dtype, VectorUDT):
        return "vector", 1
    depth, inner = 0, dtype
    while isinstance(inner, T.ArrayType):
        depth, inner = depth + 1, inner.elementType
    if depth and isinstance(inner, numeric) and depth <= 2:
        return "array", depth
    type_name = type(inner if depth else dtype).__name__
    hint = _UNSUPPORTED_HINT.get(type_name, "convert it to numbers or arrays of numbers in Spark")
    raise ValueError(
        f"column {name!r} has type {dtype.simpleString()}, which cannot be fed to a model as a "
        f"tensor: {hint}. Supported: numeric/boolean scalars, (nested up to 2) arrays of "
        f"numbers of fixed length, ML vectors."
    )


def _cache_key(df: Any, columns: Sequence[str], dtype: str, shapes: dict[str, Any]) -> str:
    plan = df._jdf.queryExecution().analyzed().semanticHash()
    raw = json.dumps(
        [
            _FORMAT,
            int(plan),
            df.schema.json(),
            list(columns),
            dtype,
            sorted((k, list(v)) for k, v in shapes.items()),
        ]
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def _check_location(cache_dir: str, master: str) -> _paths.Location:
    loc = _paths.resolve(cache_dir)
    if not master.startswith("local") and not loc.shared:
        raise ValueError(
            f"cache_dir={cache_dir!r} is a directory local to each machine, but master "
            f"{master!r} runs ranks on other nodes, which would not see the files. Use a "
            f"shared location: dbfs:/..., /dbfs/... or /Volumes/<catalog>/<schema>/<volume>/..."
        )
    try:
        os.makedirs(loc.local_path, exist_ok=True)
        probe = os.path.join(loc.local_path, f".probe-{uuid.uuid4().hex}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise ValueError(
            f"cache_dir={cache_dir!r} is not writable ({exc.strerror or exc}). Pass a "
            f"directory you can write to."
        ) from exc
    return loc


def _load(meta_dir: str) -> PreparedData | None:
    path = os.path.join(meta_dir, _META)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        m = json.load(f)
    return PreparedData(
        spark_url=m["spark_url"],
        local_path=meta_dir,
        files=tuple((p, n) for p, n in m["files"]),
        num_rows=m["num_rows"],
        columns=tuple(Column(**{**c, "shape": tuple(c["shape"])}) for c in m["columns"]),
        features=tuple(m["features"]),
        label=m["label"],
        single_feature=m["single_feature"],
    )


def materialize(
    df: Any,
    features: str | Sequence[str],
    label: str | None,
    cache_dir: str,
    dtype: str,
    shapes: dict[str, Sequence[int]],
    rows_per_file: int | None,
) -> PreparedData:
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    _check_driver()
    single = isinstance(features, str)
    feats = (features,) if isinstance(features, str) else tuple(features)
    if not feats:
        raise ValueError("features must name at least one column")
    wanted = [*feats, *([label] if label is not None else [])]
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"features and label name a column twice: {wanted}")
    fields = {f.name: f.dataType for f in df.schema.fields}
    for name in wanted:
        if name not in fields:
            raise ValueError(
                f"column {name!r} is not in the DataFrame; its columns are {sorted(fields)}"
            )
    for name in shapes:
        if name not in wanted:
            raise ValueError(f"shapes names {name!r}, which is not a feature or label column")
    kinds = {name: _column_kind(name, fields[name]) for name in wanted}
    loc = _check_location(cache_dir, str(df.sparkSession.sparkContext.master))
    key = _cache_key(df, wanted, dtype, dict(shapes))
    final = loc.join(f"df-{key}")
    existing = _load(final.local_path)
    if existing is not None:
        _say(f"reusing prepared data at {final.spark_url} ({existing.num_rows} rows)")
        return existing

    exprs, aggs = [], [F.count(F.lit(1)).alias("_rows")]
    for name in wanted:
        kind, depth = kinds[name]
        col = F.col(name)
        if kind == "vector":
            col = vector_to_array(col, dtype=dtype)
        elif _is_floating(fields[name]):
            col = col.cast(_array_type(depth, dtype))
        exprs.append(col.alias(name))
        aggs.append(F.sum(F.col(name).isNull().cast("long")).alias(f"{name}__nulls"))
    selected = df.select(*exprs)
    for name in wanted:
        kind, depth = kinds[name]
        if kind != "scalar":
            flat = F.flatten(F.col(name)) if depth == 2 else F.col(name)
            aggs += [
                F.min(F.size(flat)).alias(f"{name}__min"),
                F.max(F.size(flat)).alias(f"{name}__max"),
            ]
            if depth == 2:
                aggs.append(
                    F.first(F.size(F.col(name)[0]), ignorenulls=True).alias(f"{name}__inner")
                )
    _say("checking columns (one Spark job)")
    stats = selected.agg(*aggs).collect()[0].asDict()
    num_rows = int(stats["_rows"])
    if num_rows == 0:
        raise ValueError(
            "the DataFrame is empty: there is nothing to train on. Check its filters and source."
        )
    columns = []
    for name in wanted:
        if stats[f"{name}__nulls"]:
            raise ValueError(
                f"column {name!r} has {stats[f'{name}__nulls']} null rows; fill them "
                f"(df.fillna) or filter them out before prepare()."
            )
        kind, depth = kinds[name]
        shape: tuple[int, ...] = ()
        if kind != "scalar":
            lo, hi = stats[f"{name}__min"], stats[f"{name}__max"]
            if lo != hi:
                raise ValueError(
                    f"column {name!r} holds ragged arrays (lengths {lo}..{hi}); a batch needs "
                    f"one length. Pad or truncate them in Spark (e.g. F.slice) first."
                )
            shape = (
                (hi,)
                if depth == 1
                else (hi // max(1, stats[f"{name}__inner"]), stats[f"{name}__inner"])
            )
        if name in shapes:
            wanted_shape = tuple(int(s) for s in shapes[name])
            if math.prod(wanted_shape) != math.prod(shape or (1,)):
                raise ValueError(
                    f"shapes[{name!r}]={wanted_shape} does not fit rows of {math.prod(shape or (1,))} values"
                )
            shape = wanted_shape
        np_dtype = (
            dtype if _is_floating(fields[name]) or kind == "vector" else _numpy_name(fields[name])
        )
        columns.append(Column(name, np_dtype, shape, depth))

    row_bytes = sum(max(1, math.prod(c.shape)) * 8 for c in columns)
    per_file = rows_per_file or max(256, _TARGET_FILE_BYTES // row_bytes)
    tmp = loc.join(f".tmp-{key}-{uuid.uuid4().hex[:8]}")
    target_parts = max(1, math.ceil(num_rows / per_file))
    if selected.rdd.getNumPartitions() > target_parts:
        selected = selected.coalesce(target_parts)
    _say(f"writing {num_rows} rows to {final.spark_url}")
    try:
        selected.write.option("maxRecordsPerFile", per_file).parquet(tmp.spark_url)
        files = _file_rows(tmp.local_path)
        meta = {
            "format": _FORMAT,
            "spark_url": final.spark_url,
            "files": files,
            "num_rows": num_rows,
            "columns": [dataclasses.asdict(c) for c in columns],
            "features": list(feats),
            "label": label,
            "single_feature": single,
        }
        with open(os.path.join(tmp.local_path, _META), "w") as f:
            json.dump(meta, f)
        try:
            os.rename(tmp.local_path, final.local_path)  # the cache appears whole or not at all
        except OSError:
            if _load(final.local_path) is None:  # not a concurrent prepare of the same data
                raise
    finally:
        shutil.rmtree(tmp.local_path, ignore_errors=True)
    prepared = _load(final.local_path)
    assert prepared is not None
    return prepared


def _file_rows(root: str) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".parquet"):
            n = pq.ParquetFile(os.path.join(root, name)).metadata.num_rows
            if n:
                out.append((name, n))
    return out


def _is_floating(dtype: Any) -> bool:
    from pyspark.sql import types as T

    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType))


def _array_type(depth: int, dtype: str) -> str:
    base = {"float32": "float", "float64": "double"}[dtype]
    for _ in range(depth):
        base = f"array<{base}>"
    return base


def _numpy_name(dtype: Any) -> str:
    from pyspark.sql import types as T

    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return {
        T.ByteType: "int8",
        T.ShortType: "int16",
        T.IntegerType: "int32",
        T.LongType: "int64",
        T.BooleanType: "bool",
    }[type(dtype)]
