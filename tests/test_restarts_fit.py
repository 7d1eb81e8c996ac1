"""fit under HorovodRunner(max_restarts=2): a rank SIGKILLed mid-training, and the job goes
on by itself from the newest checkpoint into the same MLflow run. It ends with the weights
of an undisturbed run, one FINISHED run whose metric steps are each logged once, and the
restart recorded. Real ranks on Spark local[2] barrier tasks, real MLflow sqlite; the fault
is injected inside the rank (a SIGKILL at a chosen moment of attempt 1)."""

from __future__ import annotations

import os
import signal
from typing import Any

import mlflow
import numpy as np
import pytest

from helpers import digits as digit_data
from helpers.docblocks import block
from hvdrunner import HorovodRunner

EPOCHS = 5
#: Where each fault strikes in attempt 1 (the epoch is 0-based):
#: - ``rank1-in-epoch4``: rank 1 dies as epoch 4 starts, checkpoint_every=2: epoch 3 was
#:   trained (its metrics known) but no checkpoint holds it, so it is trained again;
#: - ``rank0-after-save2``: rank 0 dies right after checkpoint 2 is on disk, before epoch
#:   2's metrics reached MLflow: the restart logs them from the checkpoint.
FAULTS = {"rank1-in-epoch4": (1, 3, 2), "rank0-after-save2": (0, 2, 1)}  # rank, epoch, every


def prepared_digits(session, cache_dir: str):
    """1,024 digits (64 pixels in [0, 1], a label) prepared from ``session`` (classic or
    Spark Connect): the data every fit of these restart tests trains on."""
    return digit_data.prepared_first(session, cache_dir)


@pytest.fixture(scope="module")
def digits(spark, tmp_path_factory):
    return prepared_digits(spark, str(tmp_path_factory.mktemp("digits")))


def _steps(run_id: str) -> dict[str, list[int]]:
    client = mlflow.MlflowClient()
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("hvdrunner.")]
    return {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in keys}


def _values(run_id: str, key: str) -> list[float]:
    history = mlflow.MlflowClient().get_metric_history(run_id, key)
    return [m.value for m in sorted(history, key=lambda m: m.step)]


def _metrics(run_id: str) -> dict[str, list[float]]:
    """Each metric's values by step; every step of every metric exactly once."""
    steps = _steps(run_id)
    for key, logged in steps.items():  # none missing, none twice
        assert logged == list(range(EPOCHS)), (key, logged)
    return {key: _values(run_id, key) for key in steps}


def _check_restarted_run(run_id: str, reference: dict[str, list[float]], resumed_at: int) -> None:
    got = mlflow.get_run(run_id)
    assert got.info.status == "FINISHED"
    assert got.data.tags["hvdrunner.restarts"] == "1"
    assert "SIGKILL" in got.data.tags["hvdrunner.attempt.1"]
    assert got.data.tags["hvdrunner.initial_epoch"] == str(resumed_at)
    metrics = _metrics(run_id)
    assert set(metrics) == set(reference) and "loss" in metrics
    for key, values in metrics.items():
        np.testing.assert_allclose(values, reference[key], rtol=1e-4, err_msg=key)


# -- PyTorch ------------------------------------------------------------------------------------
def build_torch_mlp():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def torch_fit_with_fault(fault: str | None, **kwargs: Any) -> Any:
    """``hvdrunner.torch.fit``, with ``fault`` (FAULTS) striking in attempt 1 only."""
    from hvdrunner.distributed import attempt, rank
    from hvdrunner.torch import checkpoint, fit, loop

    victim, at, _ = FAULTS.get(fault or "", (-1, -1, 1))
    if attempt() == 1 and rank() == victim and fault == "rank1-in-epoch4":
        train_epoch = loop.Trainer._train_epoch

        def dies_in_epoch(self: Any, feed: Any, epoch: int) -> Any:
            if epoch == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return train_epoch(self, feed, epoch)

        loop.Trainer._train_epoch = dies_in_epoch  # type: ignore[method-assign]
    if attempt() == 1 and rank() == victim and fault == "rank0-after-save2":
        save = checkpoint.CheckpointStore.save

        def dies_after_save(self: Any, model: Any, opt: Any, done: int, metrics: Any = None) -> str:
            path = save(self, model, opt, done, metrics=metrics)
            if done == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return path

        checkpoint.CheckpointStore.save = dies_after_save  # type: ignore[method-assign]
    return fit(**kwargs)


def _torch_weights(ckpt: str) -> list[np.ndarray]:
    import torch

    state = torch.load(os.path.join(ckpt, f"epoch-{EPOCHS:05d}", "model.pt"))
    return [v.numpy() for v in state.values()]


TORCH_FIT = dict(build_model=build_torch_mlp, epochs=EPOCHS, batch_size=32, loss="cross_entropy",
                 metrics=["accuracy"], log_model=False, verbose=0)  # fmt: skip


@pytest.fixture(scope="module")
def torch_reference(digits, tmp_path_factory, empty_mlflow_db):
    """The undisturbed run: its final weights and its MLflow run."""
    import shutil

    work = tmp_path_factory.mktemp("torch-reference")
    shutil.copyfile(empty_mlflow_db, work / "mlflow.db")
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("ref", artifact_location=str(work / "a")))
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    try:
        with mlflow.start_run(run_id=run.info.run_id):
            HorovodRunner(np=2).run(torch_fit_with_fault, fault=None, data=digits,
                                    checkpoint_dir=str(work / "ckpt"), **TORCH_FIT)  # fmt: skip
        yield _torch_weights(str(work / "ckpt")), _metrics(run.info.run_id)
    finally:
        mlflow.set_tracking_uri(previous)


@pytest.mark.torch
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_torch_fit_survives_a_sigkill_and_ends_as_an_undisturbed_run(
    digits, torch_reference, store, tmp_path, fault
):
    weights, reference = torch_reference
    ckpt = str(tmp_path / "ckpt")
    every = FAULTS[fault][2]
    with mlflow.start_run() as run:
        result = HorovodRunner(np=2, max_restarts=2).run(
            torch_fit_with_fault, fault=fault, data=digits, checkpoint_dir=ckpt,
            checkpoint_every=every, **TORCH_FIT,
        )  # fmt: skip
    resumed_at = 2  # the newest checkpoint before the fault, in both cases
    assert result.initial_epoch == resumed_at and len(result.history["loss"]) == EPOCHS - 2
    for got, want in zip(_torch_weights(ckpt), weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    _check_restarted_run(run.info.run_id, reference, resumed_at)


# -- Keras --------------------------------------------------------------------------------------
def build_keras_mlp():
    from hvdrunner.keras import compat

    keras = compat.keras_module()  # tf.keras, or Keras 3 on PyTorch (19)
    return keras.Sequential([keras.Input(shape=(64,)),
                             keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])  # fmt: skip


def keras_fit_with_fault(fault: str | None, **kwargs: Any) -> Any:
    """``hvdrunner.keras.fit`` with rank 1 SIGKILLed as epoch 4 starts in attempt 1 (when
    ``fault``); returns the result and the final weights."""
    from hvdrunner.distributed import attempt, rank
    from hvdrunner.keras import compat, fit

    base: type = compat.keras_module().callbacks.Callback
    final: list[Any] = []

    class Fault(base):  # type: ignore[misc,valid-type]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if fault and attempt() == 1 and rank() == 1 and epoch == 3:
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_end(self, logs: Any = None) -> None:
            final.extend(w.tolist() for w in self.model.get_weights())

    result = fit(callbacks=[Fault()], **kwargs)
    return {"result": result, "weights": final}


KERAS_FIT = dict(build_model=build_keras_mlp, epochs=EPOCHS, batch_size=32, learning_rate=1e-3,
                 loss="sparse_categorical_crossentropy", metrics=["accuracy"], log_model=False,
                 verbose=0)  # fmt: skip


@pytest.mark.keras
@pytest.mark.keras_torch  # restarts of Keras on PyTorch too: checkpoints differ by backend
# On 19 only (CI's budget): the restart machinery is the runner's and the torch
# fit's tests run it too; Keras-on-TF's own part, its checkpoint restore after a SIGKILL, is
# test_keras_fit.py::test_resume_after_sigkill_continues_at_epoch_3 on both TF stacks.
@pytest.mark.stacks("19")
@pytest.mark.timeout(400)
def test_keras_fit_survives_a_sigkill_and_ends_as_an_undisturbed_run(digits, store, tmp_path):
    with mlflow.start_run() as reference_run:
        reference = HorovodRunner(np=2).run(keras_fit_with_fault, fault=None, data=digits,
                                            checkpoint_dir=str(tmp_path / "ref"), **KERAS_FIT)  # fmt: skip
    with mlflow.start_run() as run:
        got = HorovodRunner(np=2, max_restarts=2).run(
            keras_fit_with_fault, fault="rank1-in-epoch4", data=digits,
            checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2, **KERAS_FIT,
        )  # fmt: skip
    assert got["result"].initial_epoch == 2 and len(got["result"].history["loss"]) == EPOCHS - 2
    for a, b in zip(got["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
    _check_restarted_run(run.info.run_id, _metrics(reference_run.info.run_id), 2)


# -- your own function: docs/faults.md's recipe ---------------------------------------------------
def _doc_recipe() -> Any:
    """``train`` of docs/faults.md's recipe block, as a user pastes it into a notebook."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(block("faults.md", "restart-recipe"), "docs/faults.md", "exec"), namespace)
    return namespace["train"]


def killed_once_after_epoch_2(fn: Any, checkpoint_dir: str) -> Any:
    """Runs ``fn``; in attempt 1, rank 1 is SIGKILLed once rank 0 saved epoch 2."""
    import threading
    import time

    from hvdrunner.distributed import attempt, rank

    def strike() -> None:
        import torch

        path = os.path.join(checkpoint_dir, "last.pt")
        while not (os.path.exists(path) and torch.load(path)["epoch"] >= 2):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)

    if attempt() == 1 and rank() == 1:
        threading.Thread(target=strike, daemon=True).start()
    return fn(checkpoint_dir)


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_the_docs_restart_recipe_resumes_from_its_own_checkpoint(tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="hvdrunner")
    train = _doc_recipe()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    undisturbed = HorovodRunner(np=-2).run(train, checkpoint_dir=str(tmp_path / "a"))
    restarted = HorovodRunner(np=-2, max_restarts=1).run(
        killed_once_after_epoch_2, fn=train, checkpoint_dir=str(tmp_path / "b")
    )
    for a, b in zip(restarted, undisturbed, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    restarts = [r.getMessage() for r in caplog.records if "restarting the job" in r.getMessage()]
    assert len(restarts) == 1 and "Rank 1 died (SIGKILL" in restarts[0]


def elastic_recipe(marks: str, engine: str = "hvdrunner.hvd_torch") -> dict[str, Any]:
    """Unchanged elastic Horovod PyTorch code (``import <engine> as hvd``); rank 1 SIGKILLed
    after epoch 2's commit in attempt 1. Returns where this attempt's loop began and the
    epochs it ran."""
    import importlib

    import torch

    hvd = importlib.import_module(engine)

    from hvdrunner.distributed import attempt

    hvd.init()
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())  # fmt: skip
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    ran: list[int] = []

    @hvd.elastic.run
    def train(state: Any) -> int:
        for state.epoch in range(state.epoch, 4):  # noqa: B020 - Horovod's own idiom
            ran.append(state.epoch)
            opt.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            opt.step()
            state.commit()
            if attempt() == 1 and hvd.rank() == 1 and state.epoch == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce(torch.zeros(1), name=f"after-commit-{state.epoch}")
        return state.epoch

    last = train(state)
    return {"attempt": attempt(), "ran": ran, "last": last}


@pytest.mark.torch
@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", [
    pytest.param("horovod.torch", marks=pytest.mark.stacks("gpu")),  # the compiled one is there
    "hvdrunner.hvd_torch"])  # fmt: skip
def test_unchanged_elastic_torch_code_resumes_from_its_last_commit_after_a_restart(engine):
    """As docs/faults.md says: @hvd.elastic.run code runs under HorovodRunner, and a restart
    resumes from the last state.commit() (epoch 2's: Horovod's idiom then runs epoch 2 again,
    as it would after its own in-memory roll-back) - on the compiled horovod and on
    hvdrunner's engine alike."""
    out = HorovodRunner(np=-2, max_restarts=1).run(elastic_recipe, marks="", engine=engine)
    assert out == {"attempt": 2, "ran": [2, 3], "last": 3}
