"""Petastorm's reader arguments, checked once: honoured, or refused by name with the fix.

``make_tf_dataset`` and ``make_torch_dataloader`` take ``petastorm.make_batch_reader``'s keyword
arguments. Each one hvdrunner's data layer can honour maps onto :class:`ReadOptions`; each one
it cannot is refused with a :class:`ValueError` naming it, never ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hvdrunner._checks import is_int
from hvdrunner._logging import get_logger
from hvdrunner.data import PreparedData
from hvdrunner.data.reader import READ_AHEAD
from hvdrunner.data.transform import TransformSpec
from hvdrunner.distributed import size

_log = get_logger("hvdrunner.petastorm")

_DROP = "drop it"
# petastorm.make_batch_reader arguments with no counterpart here, and what to do instead.
NOT_OFFERED = {
    "predicate": "filter the DataFrame in Spark (df.filter(...)) before make_spark_converter",
    "filters": "filter the DataFrame in Spark (df.filter(...)) before make_spark_converter",
    "rowgroup_selector": "filter the DataFrame in Spark before make_spark_converter",
    "shard_seed": (
        "shards are equal contiguous row ranges, not randomly assigned row groups: there is "
        f"nothing to seed; {_DROP}"
    ),
    "shuffle_row_drop_partitions": f"the shuffle is a full per-epoch permutation; {_DROP}",
    "cache_location": f"there is no local disk cache (a shard that fits is held in memory); {_DROP}",
    "cache_size_limit": f"there is no local disk cache; {_DROP}",
    "cache_row_size_estimate": f"there is no local disk cache; {_DROP}",
    "cache_extra_settings": f"there is no local disk cache; {_DROP}",
    "hdfs_driver": f"the cache is read through a local path (DBFS FUSE, /Volumes, NFS); {_DROP}",
    "storage_options": f"the cache is read through a local path; {_DROP}",
    "filesystem": f"the cache is read through a local path; {_DROP}",
    "results_queue_size": f"a petastorm reader-pool setting with no counterpart here; {_DROP}",
    "zmq_copy_buffers": f"a petastorm process-pool setting with no counterpart here; {_DROP}",
    "convert_early_to_numpy": f"batches are numpy arrays from the start; {_DROP}",
}
# Arguments accepted only with the value that describes what hvdrunner does anyway.
_ONLY = {"reader_pool_type": "thread", "cache_type": "null"}
_OFFERED = ("cur_shard", "shard_count", "seed", "shuffle_row_groups", "shuffle_rows",
            "schema_fields", "transform_spec")  # fmt: skip


@dataclass(frozen=True)
class ReadOptions:
    """How one rank reads the converter's data: the petastorm arguments after their checks."""

    batch_size: int
    num_epochs: int | None  # None: endless
    shuffle: bool
    seed: int
    cur_shard: int
    shard_count: int
    read_ahead: int
    fields: tuple[str, ...]  # the columns read, in the DataFrame's order
    transform: TransformSpec | None = None  # decodes each batch on the rank (workers_count at once)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The columns of each batch: the transform's output, or the fields read."""
        return self.fields if self.transform is None else self.transform.output_names(self.fields)


def read_options(
    columns: Sequence[str],
    batch_size: Any,
    num_epochs: Any,
    workers_count: Any,
    shuffling_queue_capacity: Any,
    reader_kwargs: dict[str, Any],
) -> ReadOptions:
    """The checked :class:`ReadOptions`; ``ValueError``/``TypeError`` naming a bad argument.

    Example:
        >>> read_options(["x", "y"], 32, None, None, None, {}).shuffle
        True
    """
    _refuse_unoffered(reader_kwargs)
    kw = dict(reader_kwargs)
    shard, count = _shards(kw.get("cur_shard"), kw.get("shard_count"))
    # petastorm shuffles row groups by default; a queue (capacity > 0) or shuffle_rows
    # shuffles rows too. hvdrunner's shuffle is the full per-epoch permutation of the shard.
    capacity = _count("shuffling_queue_capacity", shuffling_queue_capacity, minimum=0) or 0
    shuffle = (
        bool(kw.get("shuffle_row_groups", True)) or bool(kw.get("shuffle_rows")) or (capacity > 0)
    )
    seed = kw.get("seed")
    if seed is not None and not is_int(seed):
        raise ValueError(f"seed={seed!r} must be an int (or None for seed 0)")
    spec = kw.get("transform_spec")
    if spec is not None and not isinstance(spec, TransformSpec):
        raise TypeError(
            f"transform_spec={spec!r}: pass a TransformSpec (from hvdrunner.petastorm import "
            f"TransformSpec; petastorm's own works after the same one-line import change)"
        )
    return ReadOptions(
        batch_size=_count("batch_size", batch_size, minimum=1) or 32,
        num_epochs=_count("num_epochs", num_epochs, minimum=1),
        shuffle=shuffle,
        seed=0 if seed is None else seed,
        cur_shard=shard,
        shard_count=count,
        read_ahead=_count("workers_count", workers_count, minimum=1) or READ_AHEAD,
        fields=_fields(columns, kw.get("schema_fields")),
        transform=spec,
    )


def _refuse_unoffered(kwargs: dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if name in NOT_OFFERED:
            raise ValueError(
                f"{name}= is a petastorm reader argument hvdrunner.petastorm does not offer: "
                f"{NOT_OFFERED[name]}"
            )
        if name in _ONLY and value != _ONLY[name]:
            raise ValueError(
                f"{name}={value!r} is not offered: hvdrunner.petastorm decodes in threads and "
                f"keeps no disk cache ({name}={_ONLY[name]!r} describes it); drop the argument"
            )
        if name not in _ONLY and name not in _OFFERED:
            raise TypeError(
                f"unexpected keyword argument {name!r}; the reader arguments offered are "
                f"{sorted(_OFFERED + tuple(_ONLY))}"
            )


def _count(name: str, value: Any, *, minimum: int) -> int | None:
    if value is None:
        return None
    if not is_int(value, at_least=minimum):
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}, or None")
    return value


def _shards(cur_shard: Any, shard_count: Any) -> tuple[int, int]:
    """``(shard, count)``; ``(0, 1)``, the whole data set, when neither is given (petastorm's
    default, even inside a Horovod job: then every rank reads every row, and a line says so)."""
    if cur_shard is None and shard_count is None:
        if size() > 1:
            _log.warning(
                "make_tf_dataset/make_torch_dataloader without cur_shard/shard_count: every "
                "rank reads the whole data set (as petastorm does); pass cur_shard=hvd.rank(), "
                "shard_count=hvd.size() to give each rank its own shard"
            )
        return 0, 1
    if cur_shard is None or shard_count is None:
        raise ValueError(
            f"cur_shard={cur_shard!r} and shard_count={shard_count!r}: pass both "
            f"(cur_shard=hvd.rank(), shard_count=hvd.size()) or neither"
        )
    count = _count("shard_count", shard_count, minimum=1)
    shard = _count("cur_shard", cur_shard, minimum=0)
    assert count is not None and shard is not None
    if shard >= count:
        raise ValueError(f"cur_shard={shard} must be in [0, shard_count={count})")
    return shard, count


def _fields(columns: Sequence[str], schema_fields: Any) -> tuple[str, ...]:
    if schema_fields is None:
        return tuple(columns)
    names = [schema_fields] if isinstance(schema_fields, str) else list(schema_fields)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"schema_fields={schema_fields!r}: pass column names (strings); Unischema fields "
            f"and regular expressions are not offered"
        )
    unknown = [n for n in names if n not in columns]
    if unknown:
        raise ValueError(
            f"schema_fields names {unknown}, not columns of the converted DataFrame {list(columns)}"
        )
    return tuple(c for c in columns if c in names)


def view(data: PreparedData, opts: ReadOptions) -> PreparedData:
    """``data`` reading only ``opts.fields``, ``opts.read_ahead`` pieces at once, fed as a
    dict of :attr:`ReadOptions.outputs` (decoded by the transform, ``workers_count`` batches
    at once, when there is one)."""
    data = dataclasses.replace(
        data, columns=tuple(c for c in data.columns if c.name in opts.fields),
        features=opts.fields, label=None, single_feature=False, read_ahead=opts.read_ahead,
    )  # fmt: skip
    if opts.transform is None:
        return data
    return data.transformed(opts.transform, list(opts.outputs), workers=opts.read_ahead)


__all__ = ["NOT_OFFERED", "ReadOptions", "read_options", "view"]
