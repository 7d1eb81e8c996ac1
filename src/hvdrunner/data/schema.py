"""What a Spark column is fed as: its kind (scalar, array, vector), the checks ``prepare``
runs on it in one Spark job, and the :class:`Column` the ranks read. Driver side."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hvdrunner._checks import is_int
from hvdrunner.data.reader import Column

DTYPES = {"float32": "float", "float64": "double"}  # and None: each column's own
UNSUPPORTED_HINT = {
    "MapType": "select the needed keys into numeric columns",
    "StructType": "select its fields as separate columns",
    "StringType": "an array of strings is not fed as one value: join them in Spark, or make "
    "token ids",
    "BinaryType": "an array of binaries is not fed as one value: one binary per row",
}
SUPPORTED = (
    "Supported: numeric/boolean scalars, (nested up to 2) arrays of numbers of fixed length "
    "(ragged ones with prepare(pad=...)), Spark ML and MLlib vectors, binary and string "
    "columns (fed as bytes and str, decoded on the ranks by a TransformSpec)."
)


def column_kind(name: str, dtype: Any) -> tuple[str, int]:
    """('scalar'|'array'|'vector'|'object', array depth) or ValueError naming the column.

    ``object``: a binary or string column, one ``bytes``/``str`` per row (images, audio,
    text), which the ranks decode (:mod:`hvdrunner.data.transform`).
    """
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as MLlibVectorUDT
    from pyspark.sql import types as T

    numeric = (T.NumericType, T.BooleanType)
    if isinstance(dtype, numeric):
        return "scalar", 0
    if isinstance(dtype, (T.BinaryType, T.StringType)):
        return "object", 0
    if isinstance(dtype, (VectorUDT, MLlibVectorUDT)):
        return "vector", 1
    depth, inner = 0, dtype
    while isinstance(inner, T.ArrayType):
        depth, inner = depth + 1, inner.elementType
    if depth and isinstance(inner, numeric) and depth <= 2:
        return "array", depth
    type_name = type(inner if depth else dtype).__name__
    hint = UNSUPPORTED_HINT.get(type_name, "convert it to numbers or arrays of numbers in Spark")
    raise ValueError(
        f"column {name!r} has type {dtype.simpleString()}, which cannot be fed to a model: "
        f"{hint}. {SUPPORTED}"
    )


def array_checks(name: str, depth: int) -> list[Any]:
    """Length bounds and null elements of an array column (nested: both levels)."""
    from pyspark.sql import functions as F

    col = F.col(name)
    flat = F.flatten(col) if depth == 2 else col
    # A null element would become NaN (floats) or INT64_MIN (ints) in a batch.
    null_elem = F.exists(flat, lambda x: x.isNull())
    aggs = [F.min(F.size(flat)).alias(f"{name}__min"), F.max(F.size(flat)).alias(f"{name}__max")]
    if depth == 2:
        null_elem = null_elem | F.exists(col, lambda a: a.isNull())
        inner = F.transform(col, lambda a: F.size(a))
        aggs += [
            F.min(F.size(col)).alias(f"{name}__outer_min"),
            F.max(F.size(col)).alias(f"{name}__outer_max"),
            F.min(F.array_min(inner)).alias(f"{name}__inner_min"),
            F.max(F.array_max(inner)).alias(f"{name}__inner_max"),
        ]
    aggs.append(F.sum(F.coalesce(null_elem, F.lit(True)).cast("long")).alias(f"{name}__null_elems"))
    return aggs


def column_spec(
    name: str, kind_depth: tuple[str, int], spark_type: Any, stats: dict[str, Any],
    shapes: dict[str, Sequence[int]], dtype: str | None,
) -> Column:  # fmt: skip
    """The column as the ranks will read it, or ValueError for nulls and ragged arrays."""
    if stats[f"{name}__nulls"]:
        raise ValueError(
            f"column {name!r} has {stats[f'{name}__nulls']} null rows; fill them "
            f"(df.fillna) or filter them out before prepare()."
        )
    kind, depth = kind_depth
    if kind == "object":
        return Column(name, "object", (), 0)
    shape = () if kind == "scalar" else _array_shape(name, depth, stats, kind == "vector")
    if name in shapes:
        wanted_shape = tuple(int(s) for s in shapes[name])
        if math.prod(wanted_shape) != math.prod(shape or (1,)):
            raise ValueError(
                f"shapes[{name!r}]={wanted_shape} does not fit rows of {math.prod(shape or (1,))} values"
            )
        shape = wanted_shape
    if kind == "vector":
        np_dtype = dtype or "float64"
    elif is_floating(spark_type):
        np_dtype = dtype or own_float(spark_type)
    else:
        np_dtype = numpy_name(spark_type)
    return Column(name, np_dtype, shape, depth)


def _array_shape(
    name: str, depth: int, stats: dict[str, Any], vector: bool = False
) -> tuple[int, ...]:
    if stats[f"{name}__null_elems"]:
        raise ValueError(
            f"column {name!r} has {stats[f'{name}__null_elems']} rows with null "
            f"elements inside their arrays (they would become NaN or INT64_MIN in a "
            f"batch); replace them in Spark first, e.g. F.transform(col, lambda x: "
            f"F.coalesce(x, F.lit(0))), or filter those rows out."
        )
    lo, hi = stats[f"{name}__min"], stats[f"{name}__max"]
    if lo != hi and vector:  # pad= pads token-id arrays, not vectors: no advice to use it
        raise ValueError(
            f"column {name!r} holds ML vectors of different sizes ({lo}..{hi}); a batch needs "
            f"one size. Make them one size in Spark first (e.g. the same feature pipeline for "
            f"every row), or filter out the rows of the other sizes."
        )
    if lo != hi:
        raise ValueError(
            f"column {name!r} holds ragged arrays (lengths {lo}..{hi}); a batch needs "
            f"one length. Pass prepare(..., pad={{{name!r}: <length>}}) to pad with 0 and "
            f"truncate to that length (token ids), or reshape them in Spark first."
        )
    if depth == 1:
        return (hi,)
    outer_len = (stats[f"{name}__outer_min"], stats[f"{name}__outer_max"])
    inner_len = (stats[f"{name}__inner_min"], stats[f"{name}__inner_max"])
    if outer_len[0] != outer_len[1] or inner_len[0] != inner_len[1]:
        raise ValueError(
            f"column {name!r} holds nested arrays of unequal shape (outer lengths "
            f"{outer_len[0]}..{outer_len[1]}, inner lengths {inner_len[0]}.."
            f"{inner_len[1]}); every row must have the same (outer, inner) shape. "
            f"Pad or reshape in Spark."
        )
    return (outer_len[0], inner_len[0])


def is_floating(dtype: Any) -> bool:
    from pyspark.sql import types as T

    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType))


def own_float(dtype: Any) -> str:
    """The numpy name a floating Spark type keeps under ``dtype=None`` (decimals: float64)."""
    from pyspark.sql import types as T

    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return "float32" if isinstance(dtype, T.FloatType) else "float64"


def array_type(depth: int, dtype: str) -> str:
    base = DTYPES[dtype]
    for _ in range(depth):
        base = f"array<{base}>"
    return base


def numpy_name(dtype: Any) -> str:
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


def check_pad(pad: dict[str, Any], kinds: dict[str, tuple[str, int]]) -> None:
    """``prepare(pad=...)``: names of 1-level numeric array columns, positive lengths."""
    for name, length in pad.items():
        if kinds.get(name) != ("array", 1):
            raise ValueError(
                f"pad names {name!r}, which is not a feature or label column holding arrays of "
                f"numbers (one level): pad pads token-id arrays"
            )
        if not is_int(length, at_least=1):
            raise ValueError(
                f"pad[{name!r}]={length!r} must be a positive int (the length to pad with 0 "
                f"or cut to)"
            )


def padded(col: Any, length: int, element_type: Any) -> Any:
    """``col`` (an array column) padded with 0 and cut to ``length`` elements, its element
    type kept."""
    from pyspark.sql import functions as F

    filler = F.array_repeat(F.lit(0).cast(element_type), length)
    return F.slice(F.concat(col, filler), 1, length)
