"""Driver side of ``hvdrunner.streaming.write_mds``: a Spark DataFrame as MDS shards, whole or
not at all.

Each Spark task writes its partition with Streaming's ``MDSWriter`` into a folder of its own
(partition and attempt in the name, so a retried task never writes over a live one); the
driver merges the index of the tasks that succeeded with Streaming's ``merge_index``, checks
that the index counts every row of the DataFrame, and only then moves the folder into place.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hvdrunner import _paths
from hvdrunner._logging import get_logger
from hvdrunner.distributed import in_horovod_rank
from hvdrunner.errors import CorruptDataError
from hvdrunner.streaming.columns import encodings, null_counts, refuse_nulls, to_sample
from hvdrunner.streaming.handle import MdsData

_log = get_logger("hvdrunner.streaming")
INDEX = "index.json"
NOT_INSTALLED = (
    "hvdrunner.streaming needs Mosaic Streaming (mosaicml-streaming), which is not installed "
    "here: %pip install mosaicml-streaming (Databricks' ML runtimes 15.4 to 18 LTS ship it)"
)


def _require_streaming() -> None:
    try:
        import streaming  # noqa: F401
    except ImportError as exc:
        raise ImportError(NOT_INSTALLED) from exc


def _part_writer(
    out: str, columns: dict[str, str], compression: str | None, size_limit: int | str
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function each Spark task runs on its partition (``mapInPandas``)."""

    def write(frames: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd
        from pyspark import TaskContext
        from streaming import MDSWriter

        ctx = TaskContext.get()
        assert ctx is not None  # mapInPandas runs in a task
        part = os.path.join(out, f"part-{ctx.partitionId():05d}-{ctx.attemptNumber()}")
        rows, writer = 0, None
        for frame in frames:
            for record in frame.to_dict("records"):
                if writer is None:  # an empty partition writes nothing
                    writer = MDSWriter(out=part, columns=columns, compression=compression,
                                       size_limit=size_limit)  # fmt: skip
                writer.write(to_sample(record, columns))
                rows += 1
        if writer is not None:
            writer.finish()
        yield pd.DataFrame({"index": [os.path.join(part, INDEX) if rows else ""], "rows": [rows]})

    return write


def _indexed_rows(root: str) -> int:
    with open(os.path.join(root, INDEX)) as f:
        return sum(int(shard["samples"]) for shard in json.load(f)["shards"])


def _write_parts(df: Any, tmp: str, columns: dict[str, str], compression: str | None,
                 size_limit: int | str) -> list[str]:  # fmt: skip
    """Every partition's index file (the Spark job), or the task's error."""
    writer = _part_writer(tmp, columns, compression, size_limit)
    rows = df.select(*[f"`{c}`" for c in columns]).mapInPandas(writer, "index string, rows long")
    return [r["index"] for r in rows.collect() if r["index"]]


def _move_into_place(tmp: str, target: str) -> None:
    """``tmp`` becomes ``target``; what ``target`` held goes only once the new data is there."""
    old = None
    if os.path.exists(target):
        old = f"{target}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    os.rename(tmp, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _target(df: Any, path: str, shared: bool, overwrite: bool) -> str:
    """The local path of ``path``, checked: seen by every rank, writable, and empty or
    holding shards to overwrite."""
    master = str(df.sparkSession.conf.get("spark.master"))
    target = _paths.for_ranks(path, master, shared, "path").local_path
    has_index = os.path.exists(os.path.join(target, INDEX))
    if has_index and not overwrite:
        raise ValueError(
            f"path={path!r} already holds MDS shards: pass overwrite=True to replace them, or "
            f"another path"
        )
    if os.listdir(target) and not has_index:
        raise ValueError(
            f"path={path!r} is a folder with other files in it: pass an empty or new folder"
        )
    return target


def _write_whole(df: Any, target: str, cols: dict[str, str], compression: str | None,
                 size_limit: int | str, rows: int) -> None:  # fmt: skip
    """The shards into a folder beside ``target``, indexed and counted, then moved into
    place; nothing left behind when any step fails."""
    from streaming.base.util import merge_index

    name = f".{os.path.basename(target)}.tmp-{uuid.uuid4().hex[:8]}"
    tmp = os.path.join(os.path.dirname(target), name)
    try:
        _log.info(f"writing {rows} rows as MDS shards ({', '.join(cols)}) to {target}")
        merge_index(_write_parts(df, tmp, cols, compression, size_limit), tmp, keep_local=True)
        written = _indexed_rows(tmp)
        if written != rows:
            raise CorruptDataError(
                f"the MDS index counts {written} rows but the DataFrame has {rows}: the "
                f"DataFrame changed while it was written (a nondeterministic source?). Cache or "
                f"save it first, then write again."
            )
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_mds(
    df: Any,
    path: str,
    *,
    features: str | Sequence[str] | None = None,
    label: str | None = None,
    columns: Sequence[str] | None = None,
    dtype: str | None = "float32",
    compression: str | None = "zstd",
    size_limit: int | str = "64mb",
    overwrite: bool = False,
    shared: bool = False,
) -> MdsData:
    """Write ``df`` as Mosaic Streaming's MDS shards at ``path``; a handle ranks read from.

    Run it on the driver before ``HorovodRunner.run``. ``path`` is a folder every rank sees:
    a Unity Catalog volume (``/Volumes/...``) or DBFS on Databricks; a local folder with
    ``local[N]``; elsewhere a shared mount declared with ``shared=True``. ``columns``: what
    to write (default ``features`` and ``label`` when given, else every column); numbers,
    booleans, strings, binary (JPEG bytes: decode them on the ranks with a ``TransformSpec``)
    and arrays of numbers; ``dtype``: floating columns written as that (``float32``, what
    models take, as in ``prepare``; ``None``: each column's own). Nulls are refused before
    anything is written, and the folder appears only whole: a failed write leaves nothing,
    and ``overwrite=True`` replaces old shards only once the new ones are complete. ``compression``/``size_limit``: Streaming's
    ``MDSWriter`` options (Streaming writes a decompressed copy of each compressed shard
    beside it on its first read).

    Raises:
        ValueError: a column is missing, of an unsupported type, or holds nulls; ``path``
            cannot be seen by the ranks or already holds data (without ``overwrite``).
        CorruptDataError: the shards' index does not count every row of ``df``.

    Example:
        >>> data = write_mds(df, "/Volumes/<catalog>/<schema>/hvdrunner/digits-mds",  # doctest: +SKIP
        ...                  features="pixels", label="label")
        >>> HorovodRunner(np=2).run(torch_fit, build_model=build, data=data, epochs=3,
        ...                         batch_size=64, loss="cross_entropy")  # doctest: +SKIP
    """
    from pyspark import TaskContext

    if TaskContext.get() is not None or in_horovod_rank():
        raise RuntimeError(
            "hvdrunner.streaming.write_mds() runs on the driver: it launches a Spark job. Call "
            "it before HorovodRunner.run() and pass the returned handle to your function."
        )
    _require_streaming()
    feats = [features] if isinstance(features, str) else list(features or [])
    fed = [*feats, *([label] if label else [])]
    cols = encodings(df.schema, columns if columns is not None else (fed or None), dtype)
    missing = [c for c in fed if c not in cols]
    if missing:
        raise ValueError(f"features/label {missing} are not among the columns written {list(cols)}")
    target = _target(df, path, shared, overwrite)
    counts = null_counts(df, cols)
    refuse_nulls(counts)
    if not counts["*"]:
        raise ValueError("the DataFrame has no rows: there is nothing to train on")
    _write_whole(df, target, cols, compression, size_limit, counts["*"])
    return MdsData(path=target, num_rows=counts["*"], columns=tuple(cols.items()),
                   features=tuple(feats), label=label, single_feature=isinstance(features, str))  # fmt: skip


__all__ = ["write_mds"]
