"""hvdrunner.keras.fit on real 2-rank jobs: accuracy, exact data-parallel equivalence,
checkpoint resume after a SIGKILL, and the refusal of non-Keras models.

Tests marked ``keras_torch`` run again on 19, where Keras 3 trains on PyTorch
without TensorFlow; their rank code takes Keras from ``compat.keras_module()``."""

from __future__ import annotations

import os
import signal

import mlflow
import numpy as np
import pandas as pd
import pytest

from conftest import rank_processes
from helpers import digits as digit_data
from hvdrunner import HorovodRunner, HorovodRunnerError
from hvdrunner.data import prepare
from hvdrunner.keras import FitConfig, compat, fit

pytestmark = [pytest.mark.keras, pytest.mark.background]  # no time bound (tests/conftest.py)


@pytest.fixture(scope="module")
def digits(spark, tmp_path_factory):
    return digit_data.prepared_split(spark, str(tmp_path_factory.mktemp("digits")), "int32")


def build_mlp():
    keras = compat.keras_module()
    return keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


@pytest.mark.keras_mode  # the logged model's format differs by Keras mode
@pytest.mark.keras_torch  # and by backend (mlflow.keras on PyTorch)
@pytest.mark.stacks("15.4", "16.4", "17.3", "18", "19")  # every replica: a runtime's smoke test
@pytest.mark.timeout(300)
def test_two_rank_fit_reaches_accuracy_and_mlflow_agrees(digits, store):
    data, x_test, y_test = digits
    with mlflow.start_run() as run:
        result = HorovodRunner(np=2).run(
            fit, build_model=build_mlp, data=data, epochs=10, batch_size=32, learning_rate=1e-3,
            loss="sparse_categorical_crossentropy", metrics=["accuracy"], warmup_epochs=2,
            registered_model_name="hvdrunner-digits",
        )  # fmt: skip
    assert result.num_ranks == 2 and result.initial_epoch == 0
    assert len(result.history["loss"]) == 10
    model = mlflow.pyfunc.load_model(result.model_uri)
    accuracy = float((np.argmax(np.asarray(model.predict(x_test)), axis=1) == y_test).mean())
    assert accuracy > 0.9  # stated target on held-out digits
    logged = mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
    np.testing.assert_allclose(
        [m.value for m in sorted(logged, key=lambda m: m.step)], result.history["loss"], rtol=1e-6
    )
    # The logged model loads and predicts where neither horovod nor hvdrunner exists.
    from helpers.pyfunc_probe import predict_without_horovod

    expected = np.argmax(np.asarray(model.predict(x_test[:20])), axis=1).tolist()
    assert predict_without_horovod(mlflow.get_tracking_uri(), result.model_uri,
                                   x_test[:20].tolist()) == expected  # fmt: skip
    versions = mlflow.MlflowClient().search_model_versions("name='hvdrunner-digits'")
    assert [v.run_id for v in versions] == [run.info.run_id]
    params = mlflow.get_run(run.info.run_id).data.params
    assert params["num_ranks"] == "2" and params["scaled_learning_rate"] == "0.002"
    from hvdrunner.keras import backend

    assert params["keras_backend"] == backend.name()
    assert params["horovod"] == backend.horovod().__name__  # which Horovod trained


def fit_and_weights(**kwargs):
    grabbed = {}

    class Grab(compat.keras_module().callbacks.Callback):
        def on_train_end(self, logs=None):
            grabbed["w"] = [w.tolist() for w in self.model.get_weights()]

    result = fit(callbacks=[Grab()], **kwargs)
    return result, grabbed["w"]


def build_linear():
    keras = compat.keras_module()
    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])


@pytest.mark.keras_mode  # the optimizer wrapper over each Keras generation's optimizers
@pytest.mark.keras_torch  # and fit's numpy feed on PyTorch
@pytest.mark.timeout(300)
def test_two_ranks_of_batch_b_equal_one_rank_of_batch_2b(spark, tmp_path):
    b, n = 16, 256
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")
    half = n // 2
    # np=2 reads rows [0,128) and [128,256) in order; step k of np=1 (batch 2b) must hold
    # the same 2b rows: block k of each half, interleaved.
    order = np.concatenate(
        [np.r_[k * b : (k + 1) * b, half + k * b : half + (k + 1) * b] for k in range(half // b)]
    )

    def as_data(idx, name):
        pdf = pd.DataFrame({"x": x[idx].tolist(), "y": y[idx]})
        return prepare(
            spark.createDataFrame(pdf), features="x", label="y", cache_dir=str(tmp_path / name)
        )

    common = dict(
        build_model=build_linear,
        epochs=2,
        loss="mse",
        optimizer="sgd",
        shuffle=False,
        log_model=False,
        verbose=0,
    )
    # Learning rates accounted for explicitly: fit scales by the rank count, so both runs
    # step with 0.02 (0.01 x 2 ranks, and 0.02 x 1 rank); no warmup.
    _, w2 = HorovodRunner(np=2).run(
        fit_and_weights,
        data=as_data(np.arange(n), "two"),
        batch_size=b,
        learning_rate=0.01,
        **common,
    )
    _, w1 = HorovodRunner(np=-1).run(
        fit_and_weights, data=as_data(order, "one"), batch_size=2 * b, learning_rate=0.02, **common
    )
    for a, c in zip(w2, w1, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(c), atol=1e-5, rtol=0)
    assert not np.allclose(np.array(w2[0]), 0.0)  # it did train


def fit_initial_and_final_weights(**kwargs):
    grabbed = {}

    class Grab(compat.keras_module().callbacks.Callback):
        def on_train_begin(self, logs=None):  # after fit's broadcast: rank 0's initial weights
            grabbed["initial"] = [w.tolist() for w in self.model.get_weights()]

        def on_train_end(self, logs=None):
            grabbed["final"] = [w.tolist() for w in self.model.get_weights()]

    fit(callbacks=[Grab()], **kwargs)
    return grabbed


@pytest.mark.keras_mode  # gradient aggregation in the optimizer wrapper, per generation
@pytest.mark.keras_torch  # and per backend (eager accumulation on PyTorch)
@pytest.mark.timeout(300)
def test_backward_passes_per_step_averages_local_batches(spark, tmp_path):
    # fit(backward_passes_per_step=2) on 2 ranks, batch 16: one update per 2 batches with
    # the mean gradient of the 64 rows both ranks passed (an effective batch of 64), at
    # fit's rank-scaled learning rate. Checked against plain numpy SGD on those rows.
    from helpers.sgd_reference import linear_sgd

    n = 256
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")
    pdf = pd.DataFrame({"x": x.tolist(), "y": y})
    data = prepare(spark.createDataFrame(pdf), features="x", label="y", cache_dir=str(tmp_path))
    out = HorovodRunner(np=2).run(
        fit_initial_and_final_weights, build_model=build_linear, data=data, epochs=2,
        batch_size=16, backward_passes_per_step=2, learning_rate=0.01, loss="mse",
        optimizer="sgd", shuffle=False, log_model=False, verbose=0,
    )  # fmt: skip
    updates = (
        [  # update u: batches 2u, 2u+1 of rank 0 (rows 0..127) and of rank 1 (128..255)
            np.r_[32 * u : 32 * u + 32, 128 + 32 * u : 128 + 32 * u + 32] for u in range(4)
        ]
        * 2
    )
    w, b = linear_sgd(*map(np.array, out["initial"]), x, y, updates, lr=0.01 * 2)
    np.testing.assert_allclose(np.array(out["final"][0]), w, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.array(out["final"][1]), b, atol=1e-5, rtol=0)
    assert not np.allclose(w, np.array(out["initial"][0]), atol=1e-3)  # it did train


def fit_killing_rank1_after_epoch2(**kwargs):
    import hvdrunner.hvd_keras as hvd

    class Kill(compat.keras_module().callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                # Runs after rank 0's checkpoint callback: once both pass this collective,
                # epoch 2's checkpoint is on disk.
                hvd.allreduce(np.float32(0.0), name="before-kill")
                if hvd.rank() == 1:
                    os.kill(os.getpid(), signal.SIGKILL)

    return fit(callbacks=[Kill()], **kwargs)


@pytest.mark.keras_mode  # checkpoint files and optimizer state, per generation
@pytest.mark.keras_torch  # and per backend
@pytest.mark.timeout(300)
def test_resume_after_sigkill_continues_at_epoch_3(digits, store, tmp_path):
    data, _, _ = digits
    ckpt = str(tmp_path / "ckpt")
    kwargs = dict(build_model=build_mlp, data=data, epochs=4, batch_size=32, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], checkpoint_dir=ckpt, keep_checkpoints=2)  # fmt: skip
    with pytest.raises(HorovodRunnerError) as info, mlflow.start_run() as failed:
        HorovodRunner(np=2).run(fit_killing_rank1_after_epoch2, **kwargs)
    assert info.value.rank == 1 and "SIGKILL" in str(info.value)
    assert mlflow.get_run(failed.info.run_id).info.status == "FAILED"
    assert sorted(os.listdir(ckpt)) == ["epoch-00001", "epoch-00002"]

    # The retry resumes into the *same* MLflow run, as a retried job task does.
    with mlflow.start_run(run_id=failed.info.run_id) as run:
        result = HorovodRunner(np=2).run(fit, **kwargs)
    assert result.initial_epoch == 2
    assert len(result.history["loss"]) == 2  # epochs 3 and 4 only
    steps = sorted(
        m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
    )
    assert steps == [0, 1, 2, 3]  # metrics continue at their epochs
    resumed = mlflow.get_run(run.info.run_id)
    assert resumed.info.status == "FINISHED"
    assert resumed.data.tags["hvdrunner.initial_epoch"] == "2"
    assert resumed.data.params["epochs"] == "4"  # logged once, not refused as a change
    assert sorted(os.listdir(ckpt)) == ["epoch-00003", "epoch-00004"]  # keeps the last 2


def build_sklearn():
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression()


def test_non_keras_model_is_refused_with_guidance(digits):
    data, _, _ = digits
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2).run(
            fit, build_model=build_sklearn, data=data, epochs=1, batch_size=32, loss="mse"
        )
    assert info.value.exc_type == "TypeError"
    assert "LogisticRegression" in info.value.remote_message
    assert "Spark MLlib" in info.value.remote_message


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epochs": 0}, "epochs must be a positive int"),
        ({"batch_size": 1.5}, "batch_size must be a positive int"),
        ({"learning_rate": 0}, "learning_rate must be a positive number"),
        ({"warmup_epochs": -1}, "warmup_epochs must be an int >= 0"),
        ({"optimizer": "lamb"}, "optimizer='lamb' is not one of"),
    ],
)
def test_fit_config_rejects_bad_settings(kwargs, match):
    base = {"epochs": 1, "batch_size": 8, "loss": "mse"}
    with pytest.raises(ValueError, match=match):
        FitConfig(**(base | kwargs))


def fit_with_rank1_drift(**kwargs):
    from hvdrunner.distributed import rank

    class Drift(compat.keras_module().callbacks.Callback):
        """Rank 1 nudges its own weights mid-epoch: what an unsynchronized optimizer does."""

        def on_train_batch_end(self, batch, logs=None):
            if rank() == 1 and batch == 0:
                self.model.set_weights([w + 0.01 for w in self.model.get_weights()])

    return fit(callbacks=[Drift()], **kwargs)


@pytest.mark.keras_torch
@pytest.mark.timeout(300)
def test_fit_fails_loudly_when_ranks_drift_apart(digits, store):
    data, _, _ = digits
    with pytest.raises(HorovodRunnerError) as info, mlflow.start_run() as run:
        HorovodRunner(np=-2).run(
            fit_with_rank1_drift, build_model=build_mlp, data=data, epochs=3, batch_size=32,
            loss="sparse_categorical_crossentropy", log_model=False,
        )  # fmt: skip
    assert info.value.exc_type == "RanksOutOfSyncError"
    assert "ranks [1]" in (info.value.remote_message or "")
    assert mlflow.get_run(run.info.run_id).info.status == "FAILED"
    # Failed after the first epoch, not at the end: only epoch 0's metrics were logged.
    assert len(mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")) <= 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"epochs": 0}, ValueError, "epochs must be a positive int"),
        ({"compression": "int8"}, ValueError, "compression must be 'none' or 'fp16'"),
        ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step must be an int"),
        ({"cycle_time_ms": -1}, ValueError, "cycle_time_ms must be a number >= 0"),
        ({"epoch": 3}, TypeError, r"unexpected argument\(s\) \['epoch'\]"),
        ({"data": [1, 2, 3]}, TypeError, "data must be prepared input"),
        # Unity Catalog's registry: checked before training, not when logging at the end.
        ({"registered_model_name": "digits"}, ValueError, "needs a three-level name"),
    ],
)
def test_fit_arguments_are_checked_on_the_driver_before_launch(digits, kwargs, error, match,
                                                             launches):  # fmt: skip
    data, _, _ = digits
    base = dict(build_model=build_mlp, data=data, epochs=1, batch_size=32, loss="mse")
    previous = mlflow.get_registry_uri()
    mlflow.set_registry_uri("databricks-uc")  # only read, never contacted, by the check
    try:
        with pytest.raises(error, match=match):
            HorovodRunner(np=-2).run(fit, **(base | kwargs))
    finally:
        mlflow.set_registry_uri(previous)
    assert launches == [] and rank_processes() == []  # no launch was asked for, no rank ran


def test_unusable_checkpoint_dir_fails_before_launch(digits, tmp_path):
    data, _, _ = digits
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    base = dict(build_model=build_mlp, data=data, epochs=1, batch_size=32, loss="mse")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        HorovodRunner(np=-2).run(fit, checkpoint_dir=str(a_file), **base)
    # /proc refuses new directories even to root: a real unwritable location.
    with pytest.raises(ValueError, match="is not writable"):
        HorovodRunner(np=-2).run(fit, checkpoint_dir="/proc/hvdrunner-test/ckpt", **base)


def early_stopping(validation, **kwargs):
    import hvdrunner.hvd_keras as hvd
    from hvdrunner.keras.inputs import prepared_input

    keras = compat.keras_module()
    local: list[float] = []  # this rank's own val_loss on its share, each epoch

    class LocalValidation(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            batch = min(kwargs["batch_size"], validation.rows_per_rank())
            with prepared_input(validation, batch, shuffle=False) as ds:
                out = self.model.evaluate(ds, steps=validation.steps_per_epoch(batch), verbose=0)
            local.append(float(out[0] if isinstance(out, list) else out))

    # min_delta far above any real improvement: every rank must stop after epoch 2, together.
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0)
    result = fit(validation=validation, callbacks=[LocalValidation(), stop], **kwargs)
    return result, hvd.allgather_object(local)


@pytest.mark.keras_torch  # the validation feed differs by backend
@pytest.mark.timeout(300)
def test_validation_metrics_and_early_stopping_agree_on_every_rank(spark, digits, store, tmp_path):
    data, x_test, y_test = digits
    pdf = pd.DataFrame({"pixels": x_test.tolist(), "label": y_test.astype("int32")})
    val = prepare(spark.createDataFrame(pdf), features="pixels", label="label",
                  cache_dir=str(tmp_path / "val"))  # fmt: skip
    with mlflow.start_run() as run:
        result, local = HorovodRunner(np=2).run(
            early_stopping, build_model=build_mlp, data=data, validation=val, epochs=8,
            batch_size=32, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
            log_model=False,
        )  # fmt: skip
    # Stopped after 2 of 8 epochs on both ranks (a rank stopping alone would hang the job).
    assert len(result.history["loss"]) == 2
    assert len(result.history["val_loss"]) == 2 and "val_accuracy" in result.history
    # Each rank's own share gives its own val_loss; what every callback saw, and what rank
    # 0 logged to MLflow, is their average (not rank 0's number).
    local = np.array(local)  # [rank][epoch]
    assert not np.allclose(local[0], local[1])
    np.testing.assert_allclose(result.history["val_loss"], local.mean(axis=0), rtol=1e-4)
    logged = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_loss")
    np.testing.assert_allclose(
        [m.value for m in sorted(logged, key=lambda m: m.step)], local.mean(axis=0), rtol=1e-4,
    )  # fmt: skip


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    "module",
    [
        # Real petastorm where it imports (lts: pyarrow < 15); hvdrunner's drop-in elsewhere.
        pytest.param("petastorm.spark", marks=pytest.mark.stacks("15.4")),
        pytest.param(
            "hvdrunner.petastorm.spark",
            marks=[pytest.mark.stacks("18", "19"), pytest.mark.keras_torch],
        ),
    ],
)
def test_fit_accepts_a_petastorm_converter_with_equal_steps(spark, tmp_path, module):
    import importlib

    petastorm_spark = importlib.import_module(module)
    pdf = digit_data.frame(*digit_data.arrays(), label_dtype="int32")
    # 7 partitions of unequal size: petastorm's row-group shards are unequal across 2 ranks.
    df = spark.createDataFrame(pdf).repartition(7)
    conf = petastorm_spark.SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF
    spark.conf.set(conf, f"file://{tmp_path}/pt")
    converter = petastorm_spark.make_spark_converter(df)
    try:
        result = HorovodRunner(np=2).run(
            fit, build_model=build_mlp, data=converter, features="pixels", label="label",
            epochs=3, batch_size=32, loss="sparse_categorical_crossentropy",
            metrics=["accuracy"], log_model=False,
        )  # fmt: skip
    finally:
        converter.delete()
        spark.conf.unset(conf)
    # common to both ranks: ceil(rows / (32 * 2)) for petastorm's endless stream, the
    # prepared data's ceil(ceil(rows / 2) / 32) for the drop-in (the same here)
    assert result.steps_per_epoch == -(-len(pdf) // (32 * 2))
    assert len(result.history["loss"]) == 3
    assert result.history["accuracy"][-1] > result.history["accuracy"][0]


def test_fit_takes_a_whole_config_and_shows_its_settings_in_the_signature(digits):
    import inspect

    params = inspect.signature(fit).parameters
    assert {"epochs", "batch_size", "loss", "warmup_epochs", "in_memory", "config"} <= set(params)
    assert (
        params["learning_rate"].default == FitConfig.__dataclass_fields__["learning_rate"].default
    )
    data, _, _ = digits
    config = FitConfig(epochs=1, batch_size=64, loss="sparse_categorical_crossentropy",
                       log_model=False)  # fmt: skip
    result = HorovodRunner(np=-1).run(fit, build_model=build_mlp, data=data, config=config,
                                      epochs=2)  # a keyword overrides the config  # fmt: skip
    assert result.epochs == 2 and len(result.history["loss"]) == 2
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['epoch'\]"):
        HorovodRunner(np=-1).run(fit, build_model=build_mlp, data=data, config=config, epoch=2)


def test_the_callback_names_are_the_classes_module_s_and_real_keras_callbacks():
    from hvdrunner.keras import _callback_classes, callbacks, compat

    assert sorted(callbacks.NAMES) == sorted(_callback_classes.__all__)
    for name in callbacks.NAMES:
        cls = getattr(callbacks, name)
        assert cls is getattr(_callback_classes, name) and cls.__name__ == name
        assert issubclass(cls, compat.keras_module().callbacks.Callback)


def fit_recording_lr(callbacks_before=(), **kwargs):
    import numpy as np

    from hvdrunner.keras import compat

    seen: list[float] = []

    class Record(compat.keras_module().callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):  # after fit's warmup set it
            seen.append(float(np.asarray(self.model.optimizer.learning_rate)))

    result = fit(callbacks=[*callbacks_before, Record()], **kwargs)
    return result, seen


@pytest.mark.keras_torch  # the rate is a backend variable, set per batch
@pytest.mark.timeout(300)
def test_warmup_ramps_the_learning_rate_per_batch_to_the_scaled_rate(digits):
    from hvdrunner.core.schedule import warmup_multiplier

    data, _, _ = digits
    result, seen = HorovodRunner(np=-2).run(
        fit_recording_lr, build_model=build_mlp, data=data, epochs=3, batch_size=64,
        learning_rate=0.01, warmup_epochs=2, optimizer="sgd", log_model=False,
        loss="sparse_categorical_crossentropy",
    )  # fmt: skip
    steps = result.steps_per_epoch
    expected = [
        0.02 * warmup_multiplier(e + b / steps, size=2, warmup_epochs=2)
        for e in range(3) for b in range(steps)
    ]  # fmt: skip
    np.testing.assert_allclose(seen, expected, rtol=1e-5)
    assert seen[0] == pytest.approx(0.01) and seen[-1] == pytest.approx(0.02)  # 1/size -> 1


def fit_recording_scheduled_lr(staircase: bool, **kwargs):
    """fit with Horovod's LearningRateScheduleCallback (hvd_keras), built in the rank."""
    import hvdrunner.hvd_keras as hvd

    if staircase:  # x0.5 for epoch 1 only; outside [start, end) the rate is left alone
        sched = hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=0.02, multiplier=0.5, start_epoch=1, end_epoch=2)  # fmt: skip
    else:  # per batch: 0.02 / (1 + fractional epoch)
        sched = hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=0.02, multiplier=lambda e: 1.0 / (1.0 + e), staircase=False)  # fmt: skip
    return fit_recording_lr(callbacks_before=[sched], **kwargs)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("staircase", [True, False], ids=["staircase", "per-batch"])
def test_the_lr_schedule_callback_sets_the_rates_horovod_would(digits, staircase):
    data, _, _ = digits
    result, seen = HorovodRunner(np=-2).run(
        fit_recording_scheduled_lr, staircase=staircase, build_model=build_mlp, data=data,
        epochs=3, batch_size=64, learning_rate=0.01, optimizer="sgd", log_model=False,
        loss="sparse_categorical_crossentropy",
    )  # fmt: skip
    steps = result.steps_per_epoch
    if staircase:  # epoch 0 at fit's scaled rate (0.01 x 2), then 0.01, kept after end_epoch
        expected = [0.02] * steps + [0.01] * steps + [0.01] * steps
    else:
        expected = [0.02 / (1 + e + b / steps) for e in range(3) for b in range(steps)]
    np.testing.assert_allclose(seen, expected, rtol=1e-5)


@pytest.mark.timeout(300)
def test_a_resume_past_the_warmup_trains_at_the_full_scaled_rate(digits, tmp_path):
    data, _, _ = digits
    args = dict(build_model=build_mlp, data=data, batch_size=64, learning_rate=0.01,
                warmup_epochs=1, optimizer="sgd", log_model=False,
                loss="sparse_categorical_crossentropy", checkpoint_dir=str(tmp_path / "ckpt"))  # fmt: skip
    first, _ = HorovodRunner(np=-2).run(fit_recording_lr, epochs=2, **args)
    assert first.initial_epoch == 0
    resumed, seen = HorovodRunner(np=-2).run(fit_recording_lr, epochs=3, **args)
    assert resumed.initial_epoch == 2 and len(seen) == resumed.steps_per_epoch
    np.testing.assert_allclose(seen, 0.02, rtol=1e-6)  # no warmup restarted from 1/size


@pytest.mark.timeout(300)
def test_keras_progress_comes_from_rank_0_only(digits, capsys):
    data, _, _ = digits
    HorovodRunner(np=-2, driver_log_verbosity="all").run(
        fit, build_model=build_mlp, data=data, epochs=2, batch_size=64, log_model=False,
        loss="sparse_categorical_crossentropy",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "[0]<stdout>: Epoch 2/2" in out
    assert not [line for line in out.splitlines() if line.startswith("[1]") and "Epoch" in line]
