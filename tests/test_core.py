"""The framework-neutral core (hvdrunner.core), without TensorFlow or Horovod: checkpoint
folders, the weight-sync verdict and the learning-rate rules every adapter shares."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from hvdrunner.core import schedule, sync
from hvdrunner.core.checkpoint import STATE, CheckpointDir
from hvdrunner.errors import CheckpointError, RanksOutOfSyncError


def _writer(payload: bytes):
    def write(tmp: str) -> dict:
        with open(os.path.join(tmp, "weights.bin"), "wb") as f:
            f.write(payload)
        return {"format": "test"}

    return write


def test_checkpoint_dir_saves_verifies_keeps_and_falls_back(tmp_path, capsys):
    store = CheckpointDir(str(tmp_path / "ckpt"), keep=2)
    for epoch in (1, 2, 3):
        store.save(_writer(bytes([epoch]) * 100), epoch)
    assert [e for e, _ in store.candidates()] == [2, 3]
    state = store.verify(store.latest()[1])
    assert state["format"] == "test" and state["epochs_done"] == 3
    with open(os.path.join(store.root, "epoch-00003", "weights.bin"), "r+b") as f:
        f.write(b"\x00")  # bit rot, same size
    assert store.latest()[0] == 2
    assert "does not match the hash" in capsys.readouterr().err


def test_a_writer_that_fails_leaves_no_checkpoint_and_no_temp_folder(tmp_path):
    store = CheckpointDir(str(tmp_path / "ckpt"), keep=3)

    def crash(tmp: str) -> dict:
        _writer(b"half")(tmp)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.save(crash, 1)
    assert os.listdir(store.root) == []
    assert store.latest() is None


def test_a_missing_state_file_is_a_checkpoint_error(tmp_path):
    store = CheckpointDir(str(tmp_path / "ckpt"), keep=3)
    path = store.save(_writer(b"x"), 1)
    os.remove(os.path.join(path, STATE))
    with pytest.raises(CheckpointError, match="missing or unreadable"):
        store.verify(path)


def test_sync_verdict_names_the_ranks_that_drifted():
    same = sync.weight_fingerprint([np.ones((3, 2)), np.arange(4.0)])
    drifted = sync.weight_fingerprint([np.ones((3, 2)), np.arange(4.0) + 1e-3])
    sync.check_fingerprints([same, same, same], fix="-")
    assert sync.out_of_sync([same, drifted, same, drifted]) == [1, 3]
    with pytest.raises(RanksOutOfSyncError, match=r"ranks \[1\].*wrap it"):
        sync.check_fingerprints([same, drifted], fix="wrap it")


def test_learning_rate_rules():
    assert schedule.scaled_lr(0.01, 8) == pytest.approx(0.08)
    ramp = [schedule.warmup_multiplier(e, size=4, warmup_epochs=2) for e in (0, 1, 2, 3)]
    assert ramp == pytest.approx([0.25, 0.625, 1.0, 1.0])
    assert schedule.warmup_multiplier(0.0, size=4, warmup_epochs=0) == 1.0


def test_the_core_imports_no_framework():
    import subprocess

    code = (
        "import sys, hvdrunner.core.checkpoint, hvdrunner.core.sync, hvdrunner.core.schedule; "
        "print(sorted(m for m in ('tensorflow', 'torch', 'horovod', 'keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_metric_averaging_reduces_the_sorted_scalars_in_one_call():
    from hvdrunner.core.metrics import average

    calls = []

    def allreduce(values):  # a stand-in for 2 ranks whose other rank holds zeros
        calls.append(values.copy())
        return values / 2

    logs = {"val_loss": 4.0, "loss": 2.0, "accuracy": np.float32(1.0), "confusion": [[1, 2]]}
    assert average(logs, size=2, allreduce=allreduce) == {"accuracy": 0.5, "loss": 1.0,
                                                          "val_loss": 2.0}  # fmt: skip
    assert len(calls) == 1 and calls[0].dtype == np.float64
    np.testing.assert_array_equal(calls[0], [1.0, 2.0, 4.0])  # sorted by name: same on every rank
    assert average(logs, size=1, allreduce=allreduce) == {"accuracy": 1.0, "loss": 2.0,
                                                          "val_loss": 4.0}  # fmt: skip
    assert len(calls) == 1  # one rank: no collective


def test_rank0_first_in_a_job_of_several_ranks_needs_horovod_initialised(monkeypatch):
    from hvdrunner import rank0_first

    with rank0_first():  # one rank: nothing to wait for
        pass
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    with (
        pytest.raises(RuntimeError, match=r"needs Horovod initialised first: call hvd.init"),
        rank0_first(),
    ):
        pass


@pytest.mark.parametrize(
    "name", ["epochs", "batch_size", "learning_rate", "warmup_epochs", "verbose",
             "checkpoint_every", "fusion_threshold_mb"],
)  # fmt: skip
def test_a_bool_is_never_a_count_or_a_number(name):
    """``True`` is an int to Python (``learning_rate=True`` was a rate of 1): every numeric
    setting refuses it, naming the setting, through the one check (hvdrunner._checks)."""
    from hvdrunner.keras.config import make_config

    required = {"epochs": 2, "batch_size": 8, "loss": "mse"}
    make_config(None, required)  # the same without the bool is fine
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        make_config(None, {**required, name: True})
