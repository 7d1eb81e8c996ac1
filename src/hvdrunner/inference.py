"""Batch inference with an MLflow model over a Spark DataFrame: numeric features through
``mlflow.pyfunc.spark_udf`` (:func:`score`), image bytes decoded on the executors by the
decode you pass (:func:`score_images`). Both return :class:`Scores`; an accuracy goes to
the training run through :mod:`hvdrunner.tracking`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdrunner import _console, _noise, tables
from hvdrunner.distributed import host_gpus
from hvdrunner.tracking import log_to_run, pin


@dataclass(frozen=True)
class Scores:
    """What a scoring call returns.

    Attributes:
        predictions: the scored DataFrame (``prediction``; :func:`score` adds
            ``probabilities``), read back from ``output_path`` when one was given.
        rows: how many rows were scored.
        accuracy: the share of rows whose prediction is the label (None without a label).
        output_path: where the predictions were written (None: not written).
    """

    predictions: Any
    rows: int
    accuracy: float | None
    output_path: str | None = None


def score(
    spark: Any,
    model_uri: str,
    df: Any,
    *,
    features: str,
    label: str | None = None,
    output_path: str | None = None,
    run_id: str | None = None,
) -> Scores:
    """Score ``df[features]`` with the model; write predictions; the accuracy if labelled.

    Adds ``probabilities`` (the model's output row) and ``prediction`` (its argmax). With
    ``label``, the accuracy is returned and, with ``run_id``, logged to that MLflow run as
    ``test_accuracy``. An alias (``models:/<name>@champion``) is resolved once to the version it
    names and that version is scored, so a job moving the alias meanwhile changes nothing here.

    Raises:
        ValueError: ``features`` is not a column; or ``run_id`` is not the run that logged the
            model (the accuracy would go to a run that did not train it).

    Example:
        >>> score(spark, "runs:/abc/model", test_df, features="pixels", label="label").accuracy  # doctest: +SKIP
        0.96
    """
    import mlflow
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType

    if features not in df.columns:
        raise ValueError(f"features={features!r} is not a column of the DataFrame ({df.columns})")
    model_uri = _pinned(model_uri, run_id)
    with _without_env_manager_warning():
        udf = mlflow.pyfunc.spark_udf(
            spark, model_uri, env_manager="local", result_type=ArrayType(FloatType())
        )
    scored = df.withColumn("probabilities", _quietly(udf)(F.col(features))).withColumn(
        "prediction",
        F.expr("array_position(probabilities, array_max(probabilities)) - 1").cast("int"),
    )
    if output_path:
        # Read back what was written, so counting and scoring do not run the model twice.
        scored = tables.read(spark, tables.write(scored, output_path))
    accuracy = None
    if label is not None:
        acc = scored.select(F.avg((F.col("prediction") == F.col(label)).cast("double"))).first()[0]
        accuracy = float(acc)
        if run_id:
            log_to_run(run_id, {"test_accuracy": accuracy})
    return Scores(scored, scored.count(), accuracy, output_path)


def _pinned(model_uri: str, run_id: str | None) -> str:
    pinned, source_run = pin(model_uri)
    if run_id and source_run and source_run != run_id:
        raise ValueError(
            f"model_uri={model_uri!r} is {pinned}, logged by run {source_run}, not by run_id="
            f"{run_id!r}: its accuracy would go to a run that did not train it. An alias another "
            f"job moved names another model; score the version this run registered, or pass "
            f"that model's run"
        )
    return pinned


def score_images(
    model_uri: str, df: Any, decode: Callable[[bytes], np.ndarray], *, run_id: str | None = None
) -> Scores:
    """The model at ``model_uri`` (its input a batch of decoded images, as
    ``hvdrunner.keras.fit`` logs it) applied to every row of ``df`` (``content``: image
    bytes, ``label_index``), ``decode`` turning each image's bytes into its array on the
    executors, a batch of rows at a time. With ``run_id``, the accuracy is logged to that
    MLflow run as ``test_accuracy``.

    Example:
        >>> decode = functools.partial(images.decode, size=32)               # doctest: +SKIP
        >>> score_images(result.model_uri, test_df, decode).accuracy           # doctest: +SKIP
        0.93
    """
    import mlflow
    from pyspark.sql import functions as F

    model_uri = _pinned(model_uri, run_id)  # the executors load this version, whatever moves

    def predict(frames: Iterator[Any]) -> Iterator[Any]:
        quiet = _noise.CHATTER + (() if host_gpus() else _noise.CPU_NOISE)
        with _console.replayed_without(quiet, progress_bars=True):
            model = mlflow.pyfunc.load_model(model_uri)
            for frame in frames:
                images = np.stack([decode(c) for c in frame["content"]])
                scores = np.asarray(model.predict(images))
                yield frame[["label_index"]].assign(
                    prediction=scores.argmax(axis=1).astype("int32")
                )

    predictions = df.select("content", "label_index").mapInPandas(
        predict, "label_index int, prediction int"
    )
    counted = predictions.agg(
        F.count("*"), F.avg((F.col("prediction") == F.col("label_index")).cast("double"))
    ).first()
    rows, accuracy = int(counted[0]), float(counted[1])
    if run_id:
        log_to_run(run_id, {"test_accuracy": accuracy})
    return Scores(predictions, rows, accuracy)


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
