"""Keras on TensorFlow from a Spark Connect session (18, which mirrors 18 LTS ML
and has its Connect client): the session a notebook holds on standard access mode or
Databricks Connect. A real Connect server (its own JVM, local[2]) and two real ranks over
gloo running ``hvdrunner.keras.fit`` with the compiled horovod; the test process talks to
Spark only through the Connect client."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from helpers import digits as digit_data
from helpers.connect_server import connect_session
from hvdrunner import HorovodRunner, workspace

pytestmark = [pytest.mark.keras, pytest.mark.stacks("18")]


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    with connect_session(tmp_path_factory.mktemp("connect")) as session:
        yield session


def build_model():
    import keras

    return keras.Sequential([keras.Input(shape=(64,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])  # fmt: skip


@pytest.mark.timeout(300)
def test_a_keras_job_on_tensorflow_runs_from_a_connect_session(connect, tmp_path, caplog):
    from hvdrunner.keras import fit

    caplog.set_level(logging.INFO, logger="hvdrunner")
    data = digit_data.prepared_first(connect, str(tmp_path / "cache"))
    result = HorovodRunner(np=2).run(
        fit, build_model=build_model, data=data, epochs=4, batch_size=32, learning_rate=0.003,
        loss="sparse_categorical_crossentropy", metrics=["accuracy"],
    )  # fmt: skip
    launched = [r.getMessage() for r in caplog.records if "over Spark Connect" in r.getMessage()]
    assert launched, "the job did not launch through the Connect backend"
    assert result.num_ranks == 2 and result.history["accuracy"][-1] > 0.8
    assert np.isfinite(result.history["loss"]).all()
    # A Connect session is what standard access mode's notebooks hold: named as such there.
    assert workspace.access_mode(connect, env={"DATABRICKS_RUNTIME_VERSION": "18.0"}) == "standard"
