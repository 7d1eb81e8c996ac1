"""scikit-learn's bundled digits (1,797 8x8 images, no download) as the tests train on them,
written once: the pixels scaled to [0, 1] as float32, a pandas frame of ``pixels``/``label``,
a stratified train/test split, and a split prepared for the ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: every image's 64 pixels in [0, 1] (float32), and its label."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype("float32"), y


def frame(x: np.ndarray, y: np.ndarray, label_dtype: str = "int64") -> pd.DataFrame:
    """A ``pixels`` (list of floats) / ``label`` frame of ``x`` and ``y``."""
    return pd.DataFrame({"pixels": x.tolist(), "label": y.astype(label_dtype)})


def split(test_size: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``x_train, x_test, y_train, y_test``: stratified, seeded."""
    from sklearn.model_selection import train_test_split

    x, y = arrays()
    return train_test_split(x, y, test_size=test_size, random_state=0, stratify=y)  # type: ignore[no-any-return]


def prepared_split(
    session: Any, cache_dir: str, label_dtype: str = "int64"
) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(prepared training split, x_test, y_test)`` from ``session`` (classic or Connect)."""
    from hvdrunner.data import prepare

    x_tr, x_te, y_tr, y_te = split()
    data = prepare(session.createDataFrame(frame(x_tr, y_tr, label_dtype)), features="pixels",
                   label="label", cache_dir=cache_dir)  # fmt: skip
    return data, x_te, y_te


def prepared_first(session: Any, cache_dir: str, rows: int = 1024) -> Any:
    """The first ``rows`` digits prepared from ``session`` (classic or Connect)."""
    from hvdrunner.data import prepare

    x, y = arrays()
    return prepare(session.createDataFrame(frame(x[:rows], y[:rows])), features="pixels",
                   label="label", cache_dir=cache_dir)  # fmt: skip


def recipe_frames(spark: Any) -> tuple[tuple[pd.DataFrame, pd.DataFrame], tuple[Any, Any]]:
    """docs/petastorm.md's recipes' data (the test and the benchmark of them): 1,437 training
    rows in 7 uneven partitions and 360 for validation, shuffled with seed 0, labels int32;
    ``((train, val) pandas frames, (train, val) Spark DataFrames)``."""
    x, y = arrays()
    order = np.random.default_rng(0).permutation(len(y))
    pdf = frame(x[order], y[order], "int32")
    train, val = pdf.iloc[:1437], pdf.iloc[1437:]
    frames = (
        spark.createDataFrame(train).repartition(7),
        spark.createDataFrame(val).repartition(3),
    )
    return (train, val), frames
