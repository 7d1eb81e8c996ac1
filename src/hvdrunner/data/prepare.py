"""Driver side of ``hvdrunner.data.prepare``: validate, write Parquet atomically, describe it."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import uuid
from collections.abc import Sequence
from typing import Any

from hvdrunner import _paths
from hvdrunner._checks import is_int
from hvdrunner._logging import get_logger
from hvdrunner.data.cache import cache_key, file_rows, input_identity, load, verified
from hvdrunner.data.handle import _FORMAT, _META, PreparedData, default_cache_dir
from hvdrunner.data.reader import Column
from hvdrunner.data.schema import (
    DTYPES,
    array_checks,
    array_type,
    check_pad,
    column_kind,
    column_spec,
    is_floating,
    own_float,
    padded,
)
from hvdrunner.distributed import in_horovod_rank

_TARGET_FILE_BYTES = 16 * 1024 * 1024
# Spark's Parquet codecs (spark.sql.parquet.compression.codec); None: Spark's default (snappy).
_CODECS = ("uncompressed", "snappy", "gzip", "lzo", "brotli", "lz4", "zstd", "bzip2", "deflate")


_log = get_logger("hvdrunner.data")


def _check_driver() -> None:
    from pyspark import TaskContext

    if TaskContext.get() is not None or in_horovod_rank():
        raise RuntimeError(
            "hvdrunner.data.prepare() runs on the driver: it launches Spark jobs. Call it "
            "before HorovodRunner.run() and pass the returned handle to your function."
        )


def prepare(
    df: Any,
    *,
    features: str | Sequence[str],
    label: str | None = None,
    cache_dir: str | None = None,
    dtype: str | None = "float32",
    shapes: dict[str, Sequence[int]] | None = None,
    rows_per_file: int | None = None,
    refresh: bool = False,
    shared: bool = False,
    compression: str | None = None,
    row_group_bytes: int | None = None,
    pad: dict[str, int] | None = None,
) -> PreparedData:
    """Write ``df``'s feature/label columns as Parquet under ``cache_dir``; return the handle.

    Runs on the driver, before ``HorovodRunner.run``. Calling it again on the same
    DataFrame reuses the files; ``data.delete()`` removes them.

    Args:
        df: a Spark DataFrame (e.g. a Delta table).
        features: one column (fed as one tensor) or several (fed as a dict of tensors).
            Numeric scalars, arrays of numbers (fixed length), Spark ML and MLlib vectors,
            and binary and string columns (images, audio, text: fed as ``bytes``/``str``
            and decoded on the ranks by a ``TransformSpec``) are supported.
        label: the label column, or ``None`` for unlabelled input.
        cache_dir: ``dbfs:/…``, ``/dbfs/…``, ``/Volumes/…`` on Databricks (shared by all
            nodes), a local directory locally. Default: ``./.hvdrunner/data-cache``.
        dtype: floating columns are cast to this (``float32`` is what Keras wants);
            ``None`` keeps each column's own (float, double; decimals and ML vectors as double).
        shapes: per-row shape of array columns, e.g. ``{"pixels": (28, 28)}`` for a flat
            784-long array; default: the array's length.
        rows_per_file: rows per Parquet file; default sized for ~16 MB files.
        refresh: write the data again even when an up-to-date copy exists.
        shared: ``cache_dir`` is a shared mount (NFS, a FUSE-mounted bucket) visible at
            the same path on every node of a non-Databricks cluster. Each rank checks it
            sees the files before training and fails naming the path if not.
        compression: the Parquet codec (``"uncompressed"``, ``"zstd"``, ...); default Spark's.
        row_group_bytes: Parquet row-group size in bytes (``parquet.block.size``); default
            Spark's. Neither changes what the ranks read, only how it is stored.
        pad: ``{column: length}`` for arrays of numbers of different lengths (token ids):
            padded with 0 and cut to that length in Spark; other ragged arrays are refused.

    The cache is reused only while the input is provably unchanged: the key covers the
    query plan, the options and every input file's path, size and modification time (a
    Delta table's current files, so any table version change). When the input cannot be
    identified (e.g. a JDBC source), it is written again each time and a line says why.

    Raises:
        ValueError: empty DataFrame, unknown or unsupported column, ragged arrays,
            unusable cache dir.
        RuntimeError: called inside a Spark task or a Horovod rank.
    """
    if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir.strip()):
        raise ValueError(
            f"cache_dir={cache_dir!r} is empty; pass a directory, or leave it out for the "
            f"default {default_cache_dir()}"
        )
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(
            # petastorm's words first (code matches on them), then ours
            f"dtype {dtype} is not supported. Use 'float32' or float64, or None (floating "
            f"columns are cast to it, None keeps their own; integer columns keep their type)"
        )
    options = _write_options(compression, row_group_bytes)
    return _materialize(
        df, features, label, cache_dir or default_cache_dir(), dtype, shapes or {}, rows_per_file,
        refresh=refresh, shared=shared, options=options, pad=dict(pad or {}),
    )  # fmt: skip


def _write_options(compression: str | None, row_group_bytes: int | None) -> dict[str, str]:
    """Spark's Parquet writer options for ``compression`` and ``row_group_bytes``, checked."""
    options = {}
    if compression is not None:
        if not isinstance(compression, str) or compression.lower() not in _CODECS:
            raise ValueError(
                f"compression={compression!r} is not a Parquet codec Spark writes; pass one of "
                f"{list(_CODECS)}, or None for Spark's default"
            )
        options["compression"] = compression.lower()
    if row_group_bytes is not None:
        if not is_int(row_group_bytes, at_least=1024):
            raise ValueError(
                f"row_group_bytes={row_group_bytes!r} must be an int of at least 1024 (bytes "
                f"per Parquet row group), or None for Spark's default"
            )
        options["parquet.block.size"] = str(row_group_bytes)
    return options


def _materialize(
    df: Any,
    features: str | Sequence[str],
    label: str | None,
    cache_dir: str,
    dtype: str | None,
    shapes: dict[str, Sequence[int]],
    rows_per_file: int | None,
    refresh: bool = False,
    shared: bool = False,
    options: dict[str, str] | None = None,
    pad: dict[str, int] | None = None,
) -> PreparedData:
    """:func:`prepare` after its argument checks: reuse a verified cache or write one."""
    _check_driver()
    feats = (features,) if isinstance(features, str) else tuple(features)
    wanted, fields, kinds = _check_columns(df, feats, label, shapes)
    pad = pad or {}
    check_pad(pad, kinds)
    loc = _paths.for_ranks(
        cache_dir, str(df.sparkSession.conf.get("spark.master")), shared, "cache_dir"
    )
    options = options or {}
    key, final, existing = _cached(df, wanted, dtype, shapes, loc, refresh, options, pad)
    if existing is not None:
        # The same columns may have been prepared with other roles (features vs label): the
        # files are the same, the roles are this call's.
        return dataclasses.replace(existing, features=feats, label=label,
                                   single_feature=isinstance(features, str))  # fmt: skip
    selected, aggs = _select(df, wanted, kinds, fields, dtype, pad)
    _log.info("checking columns (one Spark job)")
    stats = selected.agg(*aggs).collect()[0].asDict()
    num_rows = int(stats["_rows"])
    if num_rows == 0:
        raise ValueError(
            "the DataFrame is empty: there is nothing to train on. Check its filters and source."
        )
    columns = [
        column_spec(name, kinds[name], fields[name], stats, shapes, dtype) for name in wanted
    ]
    meta = {
        "features": list(feats), "label": label, "single_feature": isinstance(features, str),
        "shared": bool(shared or loc.shared),
    }  # fmt: skip
    object_bytes = sum(int(stats.get(f"{c.name}__bytes") or 0) for c in columns)
    per_file = rows_per_file or _rows_per_file(columns, object_bytes / num_rows)
    return _write(selected, columns, num_rows, (loc, final), key, per_file, meta, options)


def _rows_per_file(columns: list[Column], object_bytes_per_row: float) -> int:
    """Rows of about 16 MB of data per file (binary and string columns at their mean size)."""
    numbers = sum(max(1, math.prod(c.shape)) * 8 for c in columns if c.dtype != "object")
    return max(256, int(_TARGET_FILE_BYTES // max(1.0, numbers + object_bytes_per_row)))


def _check_columns(
    df: Any, feats: tuple[str, ...], label: str | None, shapes: dict[str, Sequence[int]]
) -> tuple[list[str], dict[str, Any], dict[str, tuple[str, int]]]:
    """The columns to write, their Spark types and kinds; ValueError naming a bad one."""
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
        if "." in name or "`" in name:  # Spark reads a dot as a struct's field
            raise ValueError(
                f"column {name!r} has a {'dot' if '.' in name else 'backtick'} in its name, "
                f"which Spark's column references cannot take here: rename it first, e.g. "
                f"df = df.withColumnRenamed({name!r}, {name.replace('.', '_').replace('`', '')!r})"
            )
    for name in shapes:
        if name not in wanted:
            raise ValueError(f"shapes names {name!r}, which is not a feature or label column")
    return wanted, fields, {name: column_kind(name, fields[name]) for name in wanted}


def _cached(
    df: Any, wanted: list[str], dtype: str | None, shapes: dict[str, Sequence[int]],
    loc: _paths.Location, refresh: bool, options: dict[str, str], pad: dict[str, int],
) -> tuple[str, _paths.Location, PreparedData | None]:  # fmt: skip
    """The cache key, the final location, and the verified copy there if it can be reused."""
    inputs = input_identity(df)
    key = cache_key(df, wanted, dtype, dict(shapes), inputs, options, pad)
    if inputs is None:
        # The input could change without any file changing: never reuse silently.
        key += f"-{uuid.uuid4().hex[:8]}"
        _log.info("the DataFrame's input is not a set of files (e.g. JDBC): its changes cannot "
             "be detected, so it is written again (not reused)")  # fmt: skip
    final = loc.join(f"df-{key}")
    existing = None if refresh else verified(final.local_path)
    if existing is not None:
        what = f"{len(inputs)} unchanged input file(s)" if inputs else "the same in-plan data"
        _log.info(f"reusing prepared data at {final.spark_url} ({existing.num_rows} rows; {what})")
    elif refresh:
        shutil.rmtree(final.local_path, ignore_errors=True)
    return key, final, existing


def _select(
    df: Any, wanted: list[str], kinds: dict[str, tuple[str, int]], fields: dict[str, Any],
    dtype: str | None, pad: dict[str, int],
) -> tuple[Any, list[Any]]:  # fmt: skip
    """The DataFrame to write (vectors as arrays, floats cast, token ids padded) and the
    checks to run on it."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    exprs, aggs = [], [F.count(F.lit(1)).alias("_rows")]
    for name in wanted:
        kind, depth = kinds[name]
        col = F.col(name)
        if name in pad:
            col = padded(col, pad[name], fields[name].elementType)
        if kind == "vector":  # a null stays null (counted and refused by name below);
            # vector_to_array itself fails on one with Spark's raw error
            col = F.when(col.isNull(), F.lit(None)).otherwise(
                vector_to_array(col, dtype=dtype or "float64")
            )
        elif kind != "object" and is_floating(fields[name]):
            col = col.cast(array_type(depth, dtype or own_float(fields[name])))
        exprs.append(col.alias(name))
        aggs.append(F.sum(F.col(name).isNull().cast("long")).alias(f"{name}__nulls"))
    for name in wanted:
        kind, depth = kinds[name]
        if kind == "object":  # their size, for files of ~16 MB
            aggs.append(F.sum(F.length(F.col(name))).alias(f"{name}__bytes"))
        elif kind != "scalar":
            aggs += array_checks(name, depth)
    return df.select(*exprs), aggs


def _write(
    selected: Any, columns: list[Column], num_rows: int,
    where: tuple[_paths.Location, _paths.Location], key: str, per_file: int,
    meta: dict[str, Any], options: dict[str, str],
) -> PreparedData:  # fmt: skip
    """Parquet into a temporary folder, checked, then renamed: whole or not at all."""
    loc, final = where
    tmp = loc.join(f".tmp-{key}-{uuid.uuid4().hex[:8]}")
    target_parts = max(1, math.ceil(num_rows / per_file))
    # Fewer partitions than target_parts stay as they are (coalesce never adds any); no
    # RDD is read, so a Spark Connect DataFrame takes the same path.
    selected = selected.coalesce(target_parts)
    _log.info(f"writing {num_rows} rows to {final.spark_url}")
    try:
        writer = selected.write.option("maxRecordsPerFile", per_file).options(**options)
        writer.parquet(tmp.spark_url)
        files = file_rows(tmp.local_path)
        seen = sum(n for _, n in files)
        if seen != num_rows:
            # Executors on a host that does not see cache_dir wrote to their own disk.
            raise RuntimeError(
                f"prepare() wrote {num_rows} rows to {final.spark_url}, but the driver sees "
                f"only {seen} of them there: some executors wrote to storage the driver does "
                f"not see. cache_dir must be one storage that every node mounts at the same "
                f"path (DBFS or /Volumes on Databricks; NFS or a FUSE-mounted bucket elsewhere)."
            )
        meta = {
            "format": _FORMAT, "spark_url": final.spark_url, "files": files,
            "num_rows": num_rows, "columns": [dataclasses.asdict(c) for c in columns], **meta,
        }  # fmt: skip
        with open(os.path.join(tmp.local_path, _META), "w") as f:
            json.dump(meta, f)
        try:
            os.rename(tmp.local_path, final.local_path)  # the cache appears whole or not at all
        except OSError:
            if load(final.local_path) is None:  # not a concurrent prepare of the same data
                raise
    finally:
        shutil.rmtree(tmp.local_path, ignore_errors=True)
    prepared = load(final.local_path)
    assert prepared is not None
    return prepared  # a concurrent prepare may have won the rename: same key, same data
