"""Batch inference with an MLflow model over a Spark DataFrame (``mlflow.pyfunc.spark_udf``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from hvdrunner import _console, _noise
from hvdrunner.distributed import host_gpus


def score(
    spark: Any,
    model_uri: str,
    df: Any,
    *,
    features: str,
    label: str | None = None,
    output_path: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Score ``df[features]`` with the model; write predictions; return accuracy if labelled.

    Adds ``probabilities`` (the model's output row) and ``prediction`` (its argmax). With
    ``label``, the accuracy is returned and, with ``run_id``, logged to that MLflow run as
    ``test_accuracy``.

    Example:
        >>> score(spark, "runs:/abc/model", test_df, features="pixels", label="label")  # doctest: +SKIP
        {'rows': 360, 'accuracy': 0.96, 'output_path': None}
    """
    import mlflow
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType

    if features not in df.columns:
        raise ValueError(f"features={features!r} is not a column of the DataFrame ({df.columns})")
    with _without_env_manager_warning():
        udf = mlflow.pyfunc.spark_udf(
            spark, model_uri, env_manager="local", result_type=ArrayType(FloatType())
        )
    scored = df.withColumn("probabilities", _quietly(udf)(F.col(features))).withColumn(
        "prediction",
        F.expr("array_position(probabilities, array_max(probabilities)) - 1").cast("int"),
    )
    if output_path:
        from hvdrunner import datasets

        # Read back what was written, so counting and scoring do not run the model twice.
        scored = datasets.read(spark, datasets.write(scored, output_path))
    result: dict[str, Any] = {"rows": scored.count(), "accuracy": None, "output_path": output_path}
    if label is not None:
        acc = scored.select(F.avg((F.col("prediction") == F.col(label)).cast("double"))).first()[0]
        result["accuracy"] = float(acc)
        if run_id:
            mlflow.MlflowClient().log_metric(run_id, "test_accuracy", float(acc))
    return result


class _EnvManagerNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return 'env_manager="local"' not in record.getMessage()


@contextlib.contextmanager
def _without_env_manager_warning() -> Iterator[None]:
    """MLflow warns that ``env_manager="local"`` may not be the training environment; here it
    is (the notebooks score in the job that trained), so the warning is not news."""
    logger, note = logging.getLogger("mlflow.pyfunc"), _EnvManagerNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def _quietly(udf: Any) -> Any:
    """``udf`` (MLflow's iterator pandas UDF) whose console output, while it scores in a Spark
    Python worker, is replayed without what is not news (:mod:`hvdrunner._console`)."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    inner = udf.func

    def scoring(iterator: Iterator[tuple[pd.Series, ...]]) -> Iterator[pd.Series]:
        # progress bars and hvdrunner._noise's lines (TensorFlow's CUDA probing only where
        # the worker has no GPU) are not news; everything else, errors included, is shown
        quiet = _noise.CHATTER + (() if host_gpus() else _noise.CPU_NOISE)
        with _console.replayed_without(quiet, progress_bars=True):
            yield from inner(iterator)

    scoring.__annotations__ = {"iterator": Iterator[tuple[pd.Series, ...]],
                               "return": Iterator[pd.Series]}  # fmt: skip
    return pandas_udf(scoring, udf.returnType)  # type: ignore[call-overload]
