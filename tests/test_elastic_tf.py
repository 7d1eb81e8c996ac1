"""Unchanged Horovod elastic TensorFlow code on hvdrunner's engine, under
``HorovodRunner(max_restarts=1)``: a rank killed mid-training, and the restarted job resumes
from the last ``state.commit()`` and ends with the undisturbed job's weights. Two of Horovod's
recipes: a TensorFlow 2 loop with ``hvd.elastic.TensorFlowKerasState`` and
``DistributedGradientTape`` (committed every 2 batches), and Keras' ``fit`` with
``hvd.elastic.KerasState`` and Horovod's elastic callbacks (committed at epoch ends).
Real gloo ranks; float64, so that "the same" means the same."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from hvdrunner import HorovodRunner

pytestmark = [pytest.mark.keras, pytest.mark.tf_engine]
EPOCHS, BATCHES = 3, 8


def _data(epoch: int, batch: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(1000 * epoch + 10 * batch + rank)
    x = g.standard_normal((16, 4))
    return x, x @ np.array([1.0, -2.0, 0.5, 3.0])


def _model(tf):
    tf.keras.backend.set_floatx("float64")
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])


def loop_recipe(marks: str, die_at: tuple[int, int] | None) -> dict:
    """Horovod's TensorFlow 2 elastic recipe: a tf.function step, DistributedGradientTape,
    the batch counter committed after the step it counts."""
    import tensorflow as tf

    import hvdrunner.hvd_tensorflow as hvd
    from hvdrunner.distributed import attempt

    hvd.init()
    model = _model(tf)
    opt = tf.keras.optimizers.SGD(0.02 * hvd.size(), momentum=0.9)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x)[:, 0] - y) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    starts: list[tuple[int, int]] = []

    @hvd.elastic.run
    def train(state) -> None:
        starts.append((state.epoch, state.batch))
        for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 - Horovod's own idiom
            while state.batch < BATCHES:
                if attempt() == 1 and (state.epoch, state.batch) == die_at and hvd.rank() == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                step(*_data(state.epoch, state.batch, hvd.rank()))
                state.batch += 1
                if state.batch % 2 == 0:
                    state.commit()
            state.batch = 0
            state.commit()

    state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0)
    state.register_reset_callbacks([lambda: Path(marks, f"reset-{attempt()}-{hvd.rank()}").touch()])
    train(state)
    return {"weights": [w.tolist() for w in model.get_weights()], "start": starts[0],
            "attempt": attempt()}  # fmt: skip


def fit_recipe(marks: str, die_at: tuple[int, int] | None) -> dict:
    """Horovod's elastic Keras recipe: ``fit`` for the epochs that remain, the state kept by
    UpdateEpochStateCallback and CommitStateCallback (after it: a commit then holds the epoch
    just ended), a commit at each epoch's end."""
    import tensorflow as tf

    import hvdrunner.hvd_keras as hvd
    from hvdrunner.distributed import attempt

    hvd.init()
    model = _model(tf)
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.02, momentum=0.9)),
                  loss="mse")  # fmt: skip
    xs, ys = zip(*(_data(0, b, hvd.rank()) for b in range(BATCHES)), strict=True)
    x, y = np.concatenate(xs), np.concatenate(ys)
    starts: list[int] = []

    class Die(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if attempt() == 1 and (state.epoch, batch) == die_at and hvd.rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state) -> None:
        starts.append(state.epoch)
        model.fit(x, y, batch_size=16, shuffle=False, epochs=EPOCHS - state.epoch, verbose=0,
                  callbacks=[Die(), hvd.elastic.UpdateEpochStateCallback(state),
                             hvd.elastic.CommitStateCallback(state, BATCHES)])  # fmt: skip

    model.build((None, 4))
    state = hvd.elastic.KerasState(model, epoch=0)
    state.register_reset_callbacks([lambda: Path(marks, f"reset-{attempt()}-{hvd.rank()}").touch()])
    train(state)
    return {"weights": [w.tolist() for w in model.get_weights()], "start": (starts[0], 0),
            "attempt": attempt(), "epoch": state.epoch}  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("recipe,die_at,resumed_at", [
    # killed before batch 5: the last commit was after batch 4; Keras 2's optimizer too
    pytest.param(loop_recipe, (1, 5), (1, 4), id="tf2-loop", marks=pytest.mark.keras_mode),
    # killed in epoch 1: the last commit ended epoch 0
    pytest.param(fit_recipe, (1, 3), (1, 0), id="keras-fit"),
])  # fmt: skip
def test_elastic_tensorflow_code_resumes_from_its_last_commit_after_a_killed_rank(
    tmp_path, recipe, die_at, resumed_at
):
    (tmp_path / "undisturbed").mkdir()
    (tmp_path / "killed").mkdir()
    reference = HorovodRunner(np=-2).run(recipe, marks=str(tmp_path / "undisturbed"), die_at=None)
    got = HorovodRunner(np=-2, max_restarts=1).run(
        recipe, marks=str(tmp_path / "killed"), die_at=die_at
    )
    assert reference["attempt"] == 1 and tuple(reference["start"]) == (0, 0)
    assert got["attempt"] == 2
    assert tuple(got["start"]) == resumed_at
    assert got.get("epoch", EPOCHS) == EPOCHS
    for mine, theirs in zip(got["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12)
    # Horovod's reset callbacks ran once on each rank of the resumed attempt only.
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == ["reset-2-0", "reset-2-1"]
    assert list((tmp_path / "undisturbed").iterdir()) == []


@pytest.mark.keras_mode  # Keras 2's optimizers build their slots another way
def test_a_state_refuses_what_it_cannot_restore_exactly():
    """Before any collective: an unbuilt model (Horovod's error), a commit interval below 1,
    and a restore whose saved values no longer match the variables (never a partial one)."""
    import tensorflow as tf

    import hvdrunner.hvd_keras as hvd
    from hvdrunner.engine.tf.elastic import UNBUILT_MODEL, TensorFlowKerasState

    unbuilt = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=re.escape(UNBUILT_MODEL)):
        TensorFlowKerasState(unbuilt, tf.keras.optimizers.SGD(0.1))
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    state = TensorFlowKerasState(model, tf.keras.optimizers.SGD(0.1, momentum=0.9), epoch=0)
    assert len(state._saved_optimizer_state) > 1  # the slots exist before the first step
    with pytest.raises(ValueError, match="batches_per_commit must be >= 1"):
        hvd.elastic.CommitStateCallback(state, batches_per_commit=0)
    state._saved_model_state = state._saved_model_state[:-1]  # as a model changed since
    with pytest.raises(ValueError, match="cannot restore the model: 1 values were saved for 2"):
        state.restore()
