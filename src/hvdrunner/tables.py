"""Tables the notebooks and scoring write and read: Delta on Databricks, Parquet elsewhere,
at a path ranks and Spark both reach (``/Volumes/...``, ``dbfs:/...``, a local folder).

Example:
    >>> url = write(df, "/Volumes/ml/team_a/hvdrunner/predictions")  # doctest: +SKIP
    >>> read(spark, url).count()                                   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from hvdrunner import _paths
from hvdrunner._paths import on_databricks


def table_format() -> str:
    """Delta on Databricks, Parquet locally (no Delta jars in the local stack)."""
    return "delta" if on_databricks() else "parquet"


def write(df: Any, path: str) -> str:
    """Overwrite ``path`` with ``df`` in :func:`table_format`; returns its Spark URL."""
    loc = _paths.resolve(path)
    _paths.require_volumes(loc.local_path)
    url = loc.spark_url
    df.write.format(table_format()).mode("overwrite").save(url)
    return url


def read(spark: Any, path: str) -> Any:
    """The table :func:`write` wrote at ``path``."""
    return spark.read.format(table_format()).load(path)
