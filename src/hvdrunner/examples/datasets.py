"""Training data for the notebooks: a source DataFrame, split and written for the next task
(``read``/``write``/``table_format``: :mod:`hvdrunner.tables`, re-exported for the notebooks)."""

from __future__ import annotations

import os
from typing import Any

from hvdrunner import _paths
from hvdrunner.tables import read, table_format, write  # noqa: F401 - the notebooks use them here

DIGITS = "sklearn:digits"


def load_digits_df(spark: Any) -> Any:
    """scikit-learn's bundled digits (1,797 8×8 images, no download) as ``pixels``/``label``.

    Example:
        >>> df = load_digits_df(spark)  # doctest: +SKIP
        >>> df.columns  # doctest: +SKIP
        ['pixels', 'label']
    """
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    rows = [
        ((row / 16.0).astype("float32").tolist(), int(label))
        for row, label in zip(x, y, strict=True)
    ]
    return spark.createDataFrame(rows, "pixels array<float>, label int")


def load_source(spark: Any, source: str) -> Any:
    """``sklearn:digits`` (or empty), a table name (``catalog.schema.table``), or a path.

    Raises:
        ValueError: a path or table that does not exist.
    """
    source = (source or "").strip()
    if source in ("", DIGITS):
        return load_digits_df(spark)
    if "/" in source or ":" in source:
        fmt = table_format()
        try:
            return spark.read.format(fmt).load(source)
        except Exception as exc:  # noqa: BLE001 - Spark raises AnalysisException and friends
            raise ValueError(
                f"source={source!r}: cannot read it as {fmt} ({exc}). Pass a table name, a path, or {DIGITS!r}."
            ) from exc
    if not spark.catalog.tableExists(source):
        raise ValueError(
            f"source={source!r}: no such table. Pass a table name, a path, or {DIGITS!r}."
        )
    return spark.table(source)


def split_and_write(
    df: Any, output_dir: str, test_fraction: float = 0.2, seed: int = 0
) -> dict[str, str]:
    """Split ``df`` into train/test and write both (Delta on Databricks, Parquet locally).

    Returns ``{"train_path", "test_path", "format"}`` to pass on as task values.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}")
    paths = split_paths(output_dir)
    train, test = df.randomSplit([1 - test_fraction, test_fraction], seed=seed)
    out = {"format": table_format()}
    for name, part in (("train", train), ("test", test)):
        out[f"{name}_path"] = write(part, paths[f"{name}_path"])
    return out


def split_paths(output_dir: str) -> dict[str, str]:
    """Where :func:`split_and_write` writes the splits of ``output_dir`` (Spark URLs)."""
    root = _paths.resolve(output_dir)  # write() refuses a /Volumes path off Databricks
    return {f"{name}_path": root.join(name).spark_url for name in ("train", "test")}


def written(output_dir: str, split: str) -> str | None:
    """The ``split`` (``train`` or ``test``) :func:`split_and_write` wrote under ``output_dir``,
    if it did (a notebook run by hand finds the previous one's output so); else None."""
    url = split_paths(output_dir)[f"{split}_path"]
    return url if os.path.isdir(_paths.resolve(url).local_path) else None


#: The synthetic flowers' classes: each a base colour (RGB) the images are noisy shades of.
FLOWERS = {"daisy": (230, 230, 90), "dandelion": (240, 200, 20), "roses": (200, 30, 60),
           "sunflowers": (250, 150, 0), "tulips": (170, 60, 200)}  # fmt: skip


def write_synthetic_flowers(folder: str, per_class: int = 120, size: int = 32,
                            seed: int = 0) -> str:  # fmt: skip
    """JPEG files laid out as Databricks' flowers data set is (``<folder>/<class>/<n>.jpg``),
    for the image notebook and tests where no images can be downloaded: each class a colour
    with a stripe at its own angle, under noise. Read them with Spark's ``binaryFile`` source.

    Example:
        >>> root = write_synthetic_flowers("/tmp/flowers", per_class=4)  # doctest: +SKIP
        >>> spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(root)  # doctest: +SKIP
    """
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    for k, (name, colour) in enumerate(FLOWERS.items()):
        out = os.path.join(folder, name)
        os.makedirs(out, exist_ok=True)
        angle = np.pi * k / len(FLOWERS)
        stripe = (np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 0.6) > 0)[..., None]
        for i in range(per_class):
            base = np.array(colour, dtype=np.float32) * rng.uniform(0.7, 1.0)
            pixels = base * np.where(stripe, 1.0, 0.55) + rng.normal(0, 18, (size, size, 3))
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            image.save(os.path.join(out, f"{i:04d}.jpg"), format="JPEG", quality=90)
    return folder
