"""Spark columns as MDS columns: one encoding per Spark type, and the checks a write needs.

hvdrunner picks the encodings itself rather than through Streaming's ``dataframe_to_mds``,
which maps Spark's signed ``ByteType`` and ``ShortType`` to ``uint8`` and ``uint16``: a -1
would be read back as 255 without an error. Here every integer keeps its sign and width.

Example:
    >>> from pyspark.sql.types import ArrayType, FloatType, StructField, StructType
    >>> encodings(StructType([StructField("x", ArrayType(FloatType()))]), None, "float64")
    {'x': 'ndarray:float64'}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Spark's scalar types (by ``typeName()``) as MDS encodings. Booleans become 0/1 ``uint8``
#: (MDS has no boolean encoding).
SCALARS: dict[str, str] = {
    "byte": "int8", "short": "int16", "integer": "int32", "long": "int64", "float": "float32",
    "double": "float64", "string": "str", "binary": "bytes", "boolean": "uint8",
}  # fmt: skip
FLOATS = ("float", "double")
#: Array element types an MDS ``ndarray`` holds (one level: MDS arrays are flat per sample).
ARRAY_ELEMENTS: dict[str, str] = {
    "byte": "int8", "short": "int16", "integer": "int32", "long": "int64", "float": "float32",
    "double": "float64", "boolean": "uint8",
}  # fmt: skip


def _encoding(name: str, data_type: Any, dtype: str | None) -> str:
    kind = data_type.typeName()
    if kind in SCALARS:
        return dtype if dtype and kind in FLOATS else SCALARS[kind]
    element = data_type.elementType.typeName() if kind == "array" else ""
    if element in ARRAY_ELEMENTS:
        return f"ndarray:{dtype if dtype and element in FLOATS else ARRAY_ELEMENTS[element]}"
    raise ValueError(
        f"column {name!r} is {data_type.simpleString()}, which MDS shards cannot hold as it "
        f"is. Supported: numbers, booleans, strings, binary (e.g. JPEG bytes) and arrays of "
        f"numbers; cast or flatten it in Spark first (e.g. F.flatten for nested arrays, "
        f"F.to_json for structs), or leave it out with columns=[...]."
    )


def encodings(schema: Any, columns: Sequence[str] | None, dtype: str | None) -> dict[str, str]:
    """``{column: MDS encoding}`` for ``columns`` of ``schema`` (all of them when ``None``),
    floating columns as ``dtype`` (``None``: their own width).

    Raises:
        ValueError: a column that is not in the DataFrame, or of a type MDS cannot hold.
    """
    fields = {f.name: f.dataType for f in schema.fields}
    names = list(fields) if columns is None else list(columns)
    missing = [n for n in names if n not in fields]
    if missing:
        raise ValueError(f"columns {missing} are not in the DataFrame (it has {list(fields)})")
    if not names:
        raise ValueError("columns=[] writes nothing: name at least one column")
    if dtype not in (None, "float32", "float64"):
        raise ValueError(f"dtype={dtype!r}: use 'float32', 'float64' or None (each column's own)")
    return {n: _encoding(n, fields[n], dtype) for n in names}


def null_counts(df: Any, columns: dict[str, str]) -> dict[str, int]:
    """Rows per column that are null or hold a null array element, with ``"*"`` the row
    count: one Spark job. A null would be written as NaN (floats), as a number nobody wrote
    (integers) or fail mid-write, so the write refuses them first."""
    from pyspark.sql import functions as F

    aggs = [F.count(F.lit(1)).alias("*")]
    for name, encoding in columns.items():
        col = F.col(f"`{name}`")
        bad = col.isNull()
        if encoding.startswith("ndarray:"):
            bad = bad | F.coalesce(F.exists(col, lambda x: x.isNull()), F.lit(False))
        aggs.append(F.sum(bad.cast("long")).alias(name))
    row = df.agg(*aggs).collect()[0]
    return {k: int(row[k] or 0) for k in ["*", *columns]}


def refuse_nulls(counts: dict[str, int]) -> None:
    """ValueError naming every column with nulls, and the fix."""
    bad = {k: v for k, v in counts.items() if k != "*" and v}
    if bad:
        listed = ", ".join(f"{k!r} ({v} rows)" for k, v in bad.items())
        raise ValueError(
            f"columns with nulls (or null array elements) cannot be written as MDS shards: "
            f"{listed}. Fill them (df.fillna / F.coalesce) or drop those rows (df.dropna) "
            f"before write_mds: a null would reach the model as NaN or as a made-up number."
        )


def to_sample(row: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """One DataFrame row (as pandas gives it) as the values MDS encodes."""
    import numpy as np

    sample = {}
    for name, encoding in columns.items():
        value = row[name]
        if encoding.startswith("ndarray:"):
            value = np.asarray(value, dtype=encoding.split(":", 1)[1])
        elif encoding == "uint8":  # a boolean
            value = int(bool(value))
        elif encoding.startswith("float"):  # a double written as float32, or the reverse
            value = float(value)
        sample[name] = value
    return sample


__all__ = ["encodings", "null_counts", "refuse_nulls", "to_sample"]
