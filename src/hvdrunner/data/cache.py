"""The prepared-data cache: its key (what the data *is*, input files included), and
integrity checks when it is reused. Driver side; used by :mod:`hvdrunner.data.prepare`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

from hvdrunner._logging import get_logger
from hvdrunner.data.handle import _FORMAT, _META, PreparedData
from hvdrunner.data.reader import Column

# Leaf relations whose data is part of the plan itself (or of the query's own RDD): the
# plan hash covers them. Any other leaf without input files may change unseen.
_SELF_CONTAINED_LEAVES = ("LocalRelation", "Range", "OneRowRelation", "LogicalRDD")


_log = get_logger("hvdrunner.data")


def input_identity(df: Any) -> list[tuple[str, int, int]] | None:
    """``(path, size, mtime)`` of every input file, or ``None`` when the input can change
    without any file changing (JDBC and other non-file sources).

    Example:
        >>> input_identity(spark.read.parquet("/data/x"))  # doctest: +SKIP
        [('file:/data/x/part-0.parquet', 1234, 1700000000000)]
    """
    files = sorted(df.inputFiles())
    if is_connect(df):
        return _connect_identity(df, files)
    jvm = df.sparkSession.sparkContext._jvm
    conf = df.sparkSession.sparkContext._jsc.hadoopConfiguration()
    out = []
    for f in files:
        path = jvm.org.apache.hadoop.fs.Path(f)
        status = path.getFileSystem(conf).getFileStatus(path)
        out.append((f, int(status.getLen()), int(status.getModificationTime())))
    if out:
        return out
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()
    names = [leaves.apply(i).getClass().getSimpleName() for i in range(leaves.size())]
    if all(n.startswith(_SELF_CONTAINED_LEAVES) for n in names):
        return []
    return None


def is_connect(df: Any) -> bool:
    """Whether ``df`` belongs to a Spark Connect session (no JVM, no RDD in this process)."""
    return type(df).__module__.startswith("pyspark.sql.connect")


def _connect_identity(df: Any, files: list[str]) -> list[tuple[str, int, int]] | None:
    """:func:`input_identity` from a Spark Connect session: the files' sizes and times as
    the cluster sees them (their metadata columns only; no content is read). A plan
    without input files is never called unchanged here: its leaves cannot be read."""
    if not files:
        return None
    from pyspark.sql import functions as F

    meta = df.sparkSession.read.format("binaryFile").load(files)
    rows = meta.select("path", "length", F.unix_millis("modificationTime").alias("ms")).collect()
    return sorted((str(r["path"]), int(r["length"]), int(r["ms"])) for r in rows)


def cache_key(
    df: Any, columns: Sequence[str], dtype: str | None, shapes: dict[str, Any], inputs: Any,
    options: dict[str, str] | None = None, pad: dict[str, int] | None = None,
) -> str:  # fmt: skip
    plan = df.semanticHash()  # the analyzed plan's, as Spark computes it (classic or Connect)
    parts = [
        _FORMAT,
        int(plan),
        df.schema.json(),
        list(columns),
        dtype,
        sorted((k, list(v)) for k, v in shapes.items()),
        inputs,
    ]
    if options:  # only when asked for: the keys of caches written without options stay valid
        parts.append(sorted(options.items()))
    if pad:
        parts.append(["pad", sorted(pad.items())])
    raw = json.dumps(parts)
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def verified(meta_dir: str) -> PreparedData | None:
    """The cached handle if the cache is whole; ``None`` (with a warning) if it is broken.

    Checks the metadata parses and every file's Parquet footer holds the rows recorded.
    """
    import pyarrow.parquet as pq

    try:
        prepared = load(meta_dir)
        if prepared is None:
            return None
        for name, rows in prepared.files:
            found = pq.ParquetFile(os.path.join(meta_dir, name)).metadata.num_rows
            if found != rows:
                raise ValueError(f"{name} holds {found} rows, {rows} were written")
    except Exception as exc:  # noqa: BLE001 - any damage means: rebuild
        _log.warning(f"the prepared data at {meta_dir} is damaged ({type(exc).__name__}: "
             f"{exc}); deleting and writing it again")  # fmt: skip
        shutil.rmtree(meta_dir, ignore_errors=True)
        return None
    return prepared


def load(meta_dir: str) -> PreparedData | None:
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
        shared=m.get("shared", False),
    )


def file_rows(root: str) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".parquet"):
            n = pq.ParquetFile(os.path.join(root, name)).metadata.num_rows
            if n:
                out.append((name, n))
    return out
