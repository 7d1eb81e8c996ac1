"""Checkpoints on real files with a real Keras model (Keras 2 or 3, whichever this stack has):
verified at save, corrupt newest ones skipped for the newest intact one, a checkpoint of
another model refused with the directory named."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hvdrunner.keras.checkpoint import OPTIMIZER, STATE, WEIGHTS, CheckpointError, CheckpointStore

# Mode-specific (Horovod's Keras layer and the guard / model saving / checkpoint files):
# also in tf_keras mode (make test-tf-keras).
pytestmark = [pytest.mark.keras, pytest.mark.keras_mode]


def compiled(width: int = 3):
    import tensorflow as tf

    from hvdrunner.keras import compat

    model = tf.keras.Sequential([tf.keras.Input(shape=(width,)), tf.keras.layers.Dense(2)])
    opt = tf.keras.optimizers.Adam(0.01)
    model.compile(optimizer=opt, loss="mse")
    compat.build_optimizer(opt, model.trainable_variables)
    return model, opt


@pytest.fixture()
def three_checkpoints(tmp_path):
    model, opt = compiled()
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=3)
    x = np.ones((8, 3), "float32")
    saved = []
    for epoch in (1, 2, 3):
        model.fit(x, np.zeros((8, 2), "float32"), epochs=1, verbose=0)
        store.save(model, opt, epoch)
        saved.append([w.copy() for w in model.get_weights()])
    return store, saved


def truncate(path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


@pytest.mark.parametrize("victim", [WEIGHTS, OPTIMIZER, STATE])
def test_corrupt_newest_falls_back_to_newest_intact(three_checkpoints, victim, capsys):
    store, saved = three_checkpoints
    newest = os.path.join(store.root, "epoch-00003")
    truncate(os.path.join(newest, victim))
    epoch, path = store.latest()
    assert epoch == 2 and path.endswith("epoch-00002")
    err = capsys.readouterr().err
    assert "skipping corrupt checkpoint" in err and newest in err and path in err
    model, opt = compiled()
    assert store.restore(path, model, opt) == 2
    for a, b in zip(model.get_weights(), saved[1], strict=True):
        np.testing.assert_array_equal(a, b)


def test_every_checkpoint_corrupt_starts_from_scratch_with_a_warning(three_checkpoints, capsys):
    store, _ = three_checkpoints
    for name in os.listdir(store.root):
        truncate(os.path.join(store.root, name, WEIGHTS))
    assert store.latest() is None
    assert "no intact checkpoint left" in capsys.readouterr().err


def test_a_checkpoint_of_another_model_is_refused_naming_the_dir(three_checkpoints):
    store, _ = three_checkpoints
    other, opt = compiled(width=5)
    with pytest.raises(CheckpointError) as info:
        store.restore(store.latest()[1], other, opt)
    assert f"checkpoint_dir={store.checkpoint_dir!r}" in str(info.value)
    assert "new directory" in str(info.value)


def test_state_records_sizes_and_hashes_and_keeps_the_last_k(tmp_path):
    model, opt = compiled()
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=2)
    for epoch in (1, 2, 3):
        store.save(model, opt, epoch)
    assert sorted(os.listdir(store.root)) == ["epoch-00002", "epoch-00003"]  # no .tmp left
    with open(os.path.join(store.root, "epoch-00003", STATE)) as f:
        state = json.load(f)
    assert state["epochs_done"] == 3
    assert set(state["files"]) == {WEIGHTS, OPTIMIZER}
    assert all(len(m["sha256"]) == 64 and m["size"] > 0 for m in state["files"].values())
