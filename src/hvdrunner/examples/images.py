"""Image classification from JPEG files, for the image notebook (``04_images``): the table
Databricks' flowers example builds, the decode that runs on the ranks, and batch scoring.

- :func:`read_image_table`: image files (``<folder>/<class>/<name>.jpg``) read with Spark's
  ``binaryFile`` source: ``content`` (the JPEG bytes), ``label`` (the folder's name) and
  ``label_index`` (a ``StringIndexer``'s).
- :func:`decode_spec`: the ``TransformSpec`` that decodes and resizes each batch on the
  ranks (PIL), for ``PreparedData.transformed`` or the petastorm drop-in.
Scoring an image table with the logged model: :func:`hvdrunner.inference.score_images`.

Example:
    >>> df = read_image_table(spark, "/Volumes/<catalog>/<schema>/hvdrunner/flowers")  # doctest: +SKIP
    >>> images = prepare(df, features=["content", "label_index"]).transformed(
    ...     decode_spec(32), "features", "label_index")                                  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import io
from typing import Any

import numpy as np

from hvdrunner.data.transform import TransformSpec


def read_image_table(spark: Any, folder: str) -> Any:
    """``content``, ``label``, ``label_index`` of every ``*.jpg``/``*.jpeg``/``*.png`` under
    ``folder`` (the label is the file's folder).

    Raises:
        ValueError: no image under ``folder``, naming it.
    """
    from pyspark.ml.feature import StringIndexer
    from pyspark.sql import functions as F

    df = (
        spark.read.format("binaryFile")
        .option("pathGlobFilter", "*.{jpg,jpeg,png,JPG,JPEG,PNG}")
        .option("recursiveFileLookup", "true")
        .load(folder)
        .select("content", F.element_at(F.split(F.col("path"), "/"), -2).alias("label"))
    )
    if df.limit(1).count() == 0:
        raise ValueError(
            f"no image files (*.jpg, *.jpeg, *.png) under {folder!r}: point images_dir at a "
            f"folder of <class>/<image> files"
        )
    indexed = StringIndexer(inputCol="label", outputCol="label_index").fit(df).transform(df)
    return indexed.withColumn("label_index", F.col("label_index").cast("int"))


def decode(content: bytes, size: int) -> np.ndarray:
    """JPEG (or PNG) bytes as a ``(size, size, 3)`` float32 image in [0, 1]."""
    from PIL import Image

    image = Image.open(io.BytesIO(content)).convert("RGB").resize((size, size))
    return np.asarray(image, dtype=np.float32) / 255.0


def _decode_batch(size: int, frame: Any) -> Any:
    frame["features"] = frame["content"].map(functools.partial(decode, size=size))
    return frame.drop(columns=["content"])


def decode_spec(size: int) -> TransformSpec:
    """Decode the ``content`` column into ``features``, ``(size, size, 3)`` float32, on the
    ranks; keeps ``label_index``.

    Example:
        >>> decode_spec(32).output_names(["content", "label_index"])
        ('features', 'label_index')
    """
    return TransformSpec(
        functools.partial(_decode_batch, size),
        edit_fields=[("features", np.float32, (size, size, 3), False)],
        selected_fields=["features", "label_index"],
    )
