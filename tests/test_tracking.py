"""MLflow across real 2-rank jobs, in a real sqlite store under a tmp dir.

The Databricks workspace cannot exist here: its credential lookup (the notebook context) is
the one thing replaced, by a fake token, to prove the token reaches ranks and nothing else.
"""

from __future__ import annotations

import os

import mlflow
import numpy as np
import pytest

from hvdrunner import HorovodRunner, HorovodRunnerError, tracking

# The Keras tests; those whose code differs by Keras mode (the logged model, autolog) are
# marked keras_mode and run again in tf_keras mode (make test-tf-keras).
pytestmark = pytest.mark.keras

FAKE_TOKEN = "dapi-FAKE-TOKEN-0123456789abcdef"


def train_tracked(epochs: int) -> dict:
    import tensorflow as tf

    import hvdrunner.hvd_keras as hvd
    from hvdrunner.keras import MLflowCallback, log_model

    hvd.init()
    tracking.log_params({"epochs": epochs, "lr": 0.05})  # every rank calls; rank 0 writes
    tracking.set_tags({"stage": "test"})

    class RankValue(tf.keras.callbacks.Callback):
        """Ranks report different local values on purpose: 1.0 and 3.0 → logged mean 2.0."""

        def on_epoch_end(self, epoch, logs=None):
            logs["rank_value"] = 1.0 + 2.0 * hvd.rank()

    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)), loss="mse")
    hist = model.fit(
        x,
        y,
        batch_size=16,
        epochs=epochs,
        verbose=0,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            RankValue(),
            MLflowCallback(),
        ],
    )
    uri = log_model(model, input_example=x[:4])
    return {
        "uri": uri,
        "loss": hist.history["loss"],
        "token_seen": os.environ.get("DATABRICKS_TOKEN") == FAKE_TOKEN,
    }


def _all_runs():
    return mlflow.search_runs(search_all_experiments=True, output_format="list")


@pytest.mark.timeout(300)
@pytest.mark.keras_mode  # the logged model's format differs by Keras mode
def test_one_run_rank0_writes_averaged_metrics_and_model(spark, store):
    with mlflow.start_run() as run:
        result = HorovodRunner(np=2).run(train_tracked, epochs=3)
    runs = _all_runs()
    assert [r.info.run_id for r in runs] == [run.info.run_id]  # no run per rank
    finished = mlflow.get_run(run.info.run_id)
    assert finished.info.status == "FINISHED"
    assert finished.data.params == {"epochs": "3", "lr": "0.05"}
    assert finished.data.tags["stage"] == "test"
    client = mlflow.MlflowClient()
    for name in ("loss", "rank_value"):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == [0, 1, 2]  # one value per epoch, no duplicates
    assert {m.value for m in client.get_metric_history(run.info.run_id, "rank_value")} == {2.0}
    logged_loss = [
        m.value
        for m in sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    ]
    np.testing.assert_allclose(logged_loss, result["loss"], rtol=1e-6)  # history holds the averages
    model = mlflow.pyfunc.load_model(result["uri"])
    assert model.predict(np.ones((2, 3), dtype="float32")).shape == (2, 1)
    assert model.metadata.signature is not None


def fail_after_logging() -> None:
    import hvdrunner.hvd_keras as hvd  # whichever Horovod this stack has (engine or compiled)

    hvd.init()
    tracking.log_params({"about_to": "fail"})
    if hvd.rank() == 1:
        raise RuntimeError(f"boom with {os.environ.get('DATABRICKS_TOKEN')}")
    hvd.allreduce(np.float32(1.0))  # rank 0 waits in a collective until aborted
    import time

    time.sleep(60)


@pytest.mark.timeout(120)
def test_failed_job_ends_the_run_failed_with_error_tag(store):
    with pytest.raises(HorovodRunnerError), mlflow.start_run() as run:
        HorovodRunner(np=-2).run(fail_after_logging)
    failed = mlflow.get_run(run.info.run_id)
    assert failed.info.status == "FAILED"
    assert "Rank 1 failed with RuntimeError: boom" in failed.data.tags[tracking.ERROR_TAG]


def test_without_an_active_run_nothing_is_logged(store):
    HorovodRunner(np=-2).run(train_tracked, epochs=1)
    assert _all_runs() == []


def print_token_then(fail: bool) -> bool:
    print(f"token in env: {os.environ.get('DATABRICKS_TOKEN')}", flush=True)
    if fail:
        raise ValueError(f"bad credentials {os.environ['DATABRICKS_TOKEN']}")
    return os.environ.get("DATABRICKS_TOKEN") == FAKE_TOKEN


@pytest.mark.timeout(300)
def test_fake_token_reaches_ranks_and_nowhere_else(store, monkeypatch, capfd):
    tmp, _ = store
    monkeypatch.setattr(
        tracking.driver,
        "_databricks_credentials",
        lambda: {"DATABRICKS_HOST": "https://fake.example", "DATABRICKS_TOKEN": FAKE_TOKEN},
    )
    with mlflow.start_run():
        result = HorovodRunner(np=-2).run(train_tracked, epochs=1)
        assert result["token_seen"]  # the rank process has it in its environment
        assert HorovodRunner(np=-2, driver_log_verbosity="all").run(print_token_then, fail=False)
    with pytest.raises(HorovodRunnerError) as info, mlflow.start_run():
        HorovodRunner(np=-2, driver_log_verbosity="all").run(print_token_then, fail=True)
    out, err = capfd.readouterr()
    assert "token in env: [REDACTED]" in out
    assert FAKE_TOKEN not in out + err
    assert FAKE_TOKEN not in str(info.value) and "[REDACTED]" in str(info.value)
    for path in tmp.rglob("*"):  # the sqlite store and every artifact
        if path.is_file():
            assert FAKE_TOKEN.encode() not in path.read_bytes(), path


def fit_with_autolog() -> None:
    import tensorflow as tf

    import hvdrunner.hvd_keras as hvd

    hvd.init()
    tracking.autolog(log_models=False, log_datasets=False)
    x = np.ones((32, 2), dtype="float32") * (1 + hvd.rank())
    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
    model.fit(
        x,
        x[:, :1],
        epochs=2,
        batch_size=8,
        verbose=0,
        callbacks=[hvd.callbacks.MetricAverageCallback()],
    )


@pytest.mark.keras_mode  # autolog patches the mode's Keras
@pytest.mark.timeout(180)
def test_autolog_on_rank0_only_into_the_job_run(store):
    with mlflow.start_run() as run:
        HorovodRunner(np=-2).run(fit_with_autolog)
    assert [r.info.run_id for r in _all_runs()] == [run.info.run_id]
    logged = mlflow.get_run(run.info.run_id)
    assert logged.data.params["epochs"] == "2"  # written by autolog
    assert sorted(
        m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
    ) == [0, 1]
    assert logged.info.status == "FINISHED"


@pytest.mark.parametrize(
    ("name", "registry", "match"),
    [
        ("digits", "databricks-uc", "needs a three-level name <catalog>.<schema>.<model>"),
        ("main.digits", "databricks-uc", "needs a three-level name"),
        ("main.default.digits", "databricks", "mlflow.set_registry_uri\\('databricks-uc'\\)"),
        ("", "databricks-uc", "must be a non-empty string"),
    ],
)
def test_registered_model_names_the_registry_would_refuse_are_refused_first(name, registry, match):
    with pytest.raises(ValueError, match=match):
        tracking.check_registered_model_name(name, registry_uri=registry)


@pytest.mark.parametrize(
    ("name", "registry"),
    [(None, "databricks-uc"), ("main.default.digits", "databricks-uc"),
     ("digits", "databricks"), ("digits", "sqlite:///x.db"), ("a.b.c", "sqlite:///x.db")],
)  # fmt: skip
def test_registered_model_names_the_registry_takes_pass(name, registry):
    tracking.check_registered_model_name(name, registry_uri=registry)


@pytest.mark.timeout(120)
def test_mlflow_run_against_a_server_that_is_down_fails_fast_naming_the_uri():
    import socket
    import time

    import mlflow

    from hvdrunner.errors import TrackingError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    previous = mlflow.get_tracking_uri()
    started = time.monotonic()
    try:
        with (
            pytest.raises(TrackingError, match=f"MLflow tracking at {dead} could not start"),
            tracking.mlflow_run(experiment="x", tracking_uri=dead),
        ):
            pytest.fail("no run can start against a server that is down")
        # MLflow's own retries took 250 s here; hvdrunner's bound is one try, seconds.
        assert time.monotonic() - started < 30
        assert mlflow.active_run() is None
    finally:
        mlflow.set_tracking_uri(previous)


def never_runs() -> None:
    raise AssertionError("no rank may start when rank 0 could not log")


@pytest.mark.parametrize("where", ["another-store", "server-down"])
def test_an_active_run_the_ranks_cannot_reach_is_refused_before_launch(store, tmp_path, where):
    # The notebook's run lives in one store; the tracking URI now points elsewhere (changed
    # after start_run, or its server is down): rank 0 would fail only after training.
    import socket
    import time

    from hvdrunner.errors import TrackingError

    if where == "another-store":
        other = f"sqlite:///{tmp_path / 'other.db'}"
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            other = f"http://127.0.0.1:{s.getsockname()[1]}"
    home = mlflow.get_tracking_uri()
    with mlflow.start_run() as run:
        mlflow.set_tracking_uri(other)
        started = time.monotonic()
        try:
            with pytest.raises(TrackingError) as info:
                HorovodRunner(np=-2).run(never_runs)
        finally:
            mlflow.set_tracking_uri(home)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert message.startswith(f"the active MLflow run {run.info.run_id} is not reachable")
    assert other in message and "mlflow.set_tracking_uri" in message
    assert elapsed < 30  # one bounded try, not MLflow's minutes of retries


def test_model_logging_lives_with_its_framework():
    # tracking imports no framework; its old names say where they went.
    with pytest.raises(AttributeError, match=r"moved to hvdrunner.keras.log_model"):
        tracking.log_model  # noqa: B018
    with pytest.raises(AttributeError, match=r"moved to hvdrunner.torch.log_model"):
        tracking.log_pytorch_model  # noqa: B018


# -- the registry: an alias for the newest good version, scored as the version it names ----


@pytest.mark.parametrize("alias", ["", "latest", "V3", "1st", "has-hyphen", "a b", None])
def test_aliases_the_registry_would_refuse_are_refused_first(alias):
    with pytest.raises(ValueError, match="model_alias="):
        tracking.check_model_alias(alias)


def _version(client, name: str, run_id: str) -> str:
    """A real version in the real (sqlite) registry, from a run's artifact folder."""
    return client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id).version


def test_the_alias_moves_to_the_runs_newest_version_and_scoring_pins_it(store):
    client = mlflow.MlflowClient()
    client.create_registered_model("ml.team.digits")
    runs = []
    for _ in range(2):
        with mlflow.start_run() as run:
            runs.append(run.info.run_id)
    first = _version(client, "ml.team.digits", runs[0])
    _version(client, "ml.team.digits", runs[1])
    retried = _version(client, "ml.team.digits", runs[0])  # a retry of the first job's run
    uri = tracking.set_alias("ml.team.digits", "champion", runs[0])
    assert uri == "models:/ml.team.digits@champion"
    assert client.get_model_version_by_alias("ml.team.digits", "champion").version == retried
    assert retried != first
    assert tracking.pin(uri) == (f"models:/ml.team.digits/{retried}", runs[0])
    assert tracking.pin("models:/ml.team.digits/2") == ("models:/ml.team.digits/2", runs[1])
    assert tracking.pin("runs:/abc/model") == ("runs:/abc/model", "abc")
    # A run that registered nothing moves nothing.
    with mlflow.start_run() as run:
        pass
    with pytest.raises(LookupError, match="registered no version"):
        tracking.set_alias("ml.team.digits", "champion", run.info.run_id)
    assert client.get_model_version_by_alias("ml.team.digits", "champion").version == retried


def test_scoring_by_an_alias_another_run_moved_is_refused_before_anything_is_scored(store, spark):
    from hvdrunner.inference import score

    client = mlflow.MlflowClient()
    client.create_registered_model("ml.team.digits")
    with mlflow.start_run() as ours:
        pass
    with mlflow.start_run() as theirs:
        pass
    _version(client, "ml.team.digits", theirs.info.run_id)
    tracking.set_alias("ml.team.digits", "champion", theirs.info.run_id)
    df = spark.createDataFrame([([0.0, 1.0], 1)], ["pixels", "label"])
    with pytest.raises(ValueError, match=f"logged by run {theirs.info.run_id}, not by run_id"):
        score(spark, "models:/ml.team.digits@champion", df, features="pixels", label="label",
              run_id=ours.info.run_id)  # fmt: skip
    assert "test_accuracy" not in mlflow.get_run(ours.info.run_id).data.metrics


def test_a_unity_catalog_name_on_mlflow_2s_workspace_registry_goes_to_unity_catalog():
    # 15.4 LTS ML's MLflow 2 defaults to the workspace registry on Databricks, which refuses a
    # three-level name after training; the notebooks call registry_for before it.
    previous = mlflow.get_registry_uri()
    try:
        mlflow.set_registry_uri("databricks")
        tracking.registry_for("main.ml.digits", "champion")
        assert mlflow.get_registry_uri() == "databricks-uc"
        mlflow.set_registry_uri("databricks")
        with pytest.raises(ValueError, match="model_alias="):
            tracking.registry_for("main.ml.digits", "latest")
        tracking.registry_for("digits")  # a workspace name stays in the workspace registry
        assert mlflow.get_registry_uri() == "databricks"
    finally:
        mlflow.set_registry_uri(previous)


def sleep_a_little() -> int:
    import time

    time.sleep(3)  # a few samples at a 1-second interval
    return 0


@pytest.mark.timeout(180)
def test_system_metrics_come_from_each_host_when_mlflows_switch_is_on(store, monkeypatch):
    from helpers.docblocks import block

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    scope: dict = {"__name__": "docs_example", "train": sleep_a_little}
    try:
        exec(compile(block("tracking.md", "system-metrics"), "docs/tracking.md", "exec"), scope)  # noqa: S102
    finally:
        mlflow.disable_system_metrics_logging()
    metrics = mlflow.get_run(scope["run"].info.run_id).data.metrics
    assert "system/node_0/cpu_utilization_percentage" in scope["host"]
    # One host here: one monitor, however many ranks it runs.
    assert not [k for k in metrics if k.startswith("system/node_1/")]
    # Off (the default): no rank logs any.
    with mlflow.start_run() as run:
        HorovodRunner(np=2).run(sleep_a_little)
    assert not [k for k in mlflow.get_run(run.info.run_id).data.metrics if "node_" in k]
