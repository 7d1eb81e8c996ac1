"""docs/data.md's text example, run as written: words to token ids in Spark, ragged lengths
padded by prepare(pad=...), an embedding model trained by hvdrunner.torch.fit on 2 ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.docblocks import block

DOC = Path(__file__).resolve().parents[1] / "docs" / "data.md"
GOOD = ["good", "great", "fine", "lovely", "superb"]
BAD = ["bad", "awful", "poor", "dull", "boring"]
FILLER = ["the", "a", "movie", "plot", "acting", "was", "and", "film", "story", "cast"]


def reviews(spark, n: int = 800):
    """Sentences of 4 to 24 words; label 1 when the review's sentiment words are good."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(n):
        label = int(rng.integers(2))
        length = int(rng.integers(4, 25))
        pool = GOOD if label else BAD
        words = [pool[rng.integers(5)] if rng.random() < 0.3 else FILLER[rng.integers(10)]
                 for _ in range(length)]  # fmt: skip
        words[rng.integers(length)] = pool[rng.integers(5)]  # at least one
        rows.append((" ".join(words), label))
    return spark.createDataFrame(rows, "text string, label int").repartition(3)


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_the_text_example_trains_an_embedding_model(spark, tmp_path):
    source = block("data.md", "text")
    namespace = {"__name__": "__main__", "spark": spark, "df": reviews(spark),
                 "cache_dir": str(tmp_path)}  # fmt: skip
    exec(compile(source, str(DOC), "exec"), namespace)  # noqa: S102 - the doc as written
    data = namespace["data"]
    assert [(c.name, c.dtype, c.shape) for c in data.columns] == [
        ("tokens", "int32", (16,)), ("label", "int32", ())]  # fmt: skip
    assert namespace["accuracy"] > 0.9


def keras_text_model(vocab_size=32):
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input(shape=(16,), dtype="int32"),
        tf.keras.layers.Embedding(vocab_size, 16),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(2, activation="softmax"),
    ])  # fmt: skip


@pytest.mark.keras
@pytest.mark.stacks("18")
@pytest.mark.timeout(300)
def test_the_same_token_ids_train_a_keras_embedding_model(spark, tmp_path):
    from pyspark.sql import functions as F

    import hvdrunner.keras
    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare

    df = reviews(spark)
    vocab = {w: i + 1 for i, w in enumerate(sorted(GOOD + BAD + FILLER))}
    to_ids = F.udf(lambda text: [vocab[w] for w in text.split()], "array<int>")
    data = prepare(df.withColumn("tokens", to_ids("text")), features="tokens", label="label",
                   pad={"tokens": 16}, cache_dir=str(tmp_path))  # fmt: skip
    result = HorovodRunner(np=2).run(
        hvdrunner.keras.fit, build_model=keras_text_model, data=data, epochs=8, batch_size=16,
        learning_rate=0.01, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
    )  # fmt: skip
    assert result.history["accuracy"][-1] > 0.9
