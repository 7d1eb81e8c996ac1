"""Batch inference with an MLflow model over a Spark DataFrame (``mlflow.pyfunc.spark_udf``)."""

from __future__ import annotations

from typing import Any


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
    udf = mlflow.pyfunc.spark_udf(
        spark, model_uri, env_manager="local", result_type=ArrayType(FloatType())
    )
    scored = df.withColumn("probabilities", udf(F.col(features))).withColumn(
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
