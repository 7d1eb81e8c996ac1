"""Shared fixtures: one real local[2] SparkSession per test run, tmp MLflow and cache dirs."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

# TF's C++ banner lines are noise in test output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every JVM the tests start (the session's Spark, the subprocesses' - notebooks, the stand-in's
# tasks, the clusters' drivers and daemons) lives for seconds to minutes: C1 alone compiles
# what it runs, where C2's compiler threads spent CPU on code the JVM leaves before it pays
# (a local session that starts, groups and writes: 8 CPU-s instead of 14 on 2 cores). Set
# here, every subprocess inherits it; a user's sessions keep the JVM's default.
JVM_OPTIONS = ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS")
C1_ONLY = "-XX:TieredStopAtLevel=1"
for _jvm_options in JVM_OPTIONS:
    os.environ.setdefault(_jvm_options, C1_ONLY)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

WORKER_MODULE = "hvdrunner._launch.rank.worker"


def _keras_on_torch() -> bool:
    """Keras 3 and torch without TensorFlow: Keras runs on PyTorch here, as a notebook on a
    runtime without TensorFlow would set it (the runner passes it on to the ranks)."""
    import importlib.metadata as md

    try:
        keras3 = md.version("keras").startswith("3.")
    except md.PackageNotFoundError:
        return False
    return keras3 and _installed("torch") and not _installed("tensorflow")


def _installed(dist: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(dist)
    except md.PackageNotFoundError:
        return False
    return True


#: Where each test runs (CI runs `make test` on every stack; docs/testing.md). A test runs
#: where it adds information:
#: - ``torch``-marked: the newest runtime's replica, 19 (torch 2.12, no TensorFlow);
#: - ``keras``-marked (Keras and TensorFlow behaviour): every TensorFlow stack (15.4: Keras
#:   3.2, the oldest Keras 3 a runtime ships; 18: Keras 3.12); those also marked
#:   ``keras_mode`` (a code path that differs by Keras mode: Horovod's Keras layer and the
#:   guard, model saving, checkpoint files, the optimizer wrapper) again in tf_keras mode
#:   (`make test-tf-keras`); those also marked ``keras_torch`` (a path that differs by Keras
#:   backend: the collectives, the optimizer wrapper, fit's feed, checkpoints, the logged
#:   model) on 19 too, where Keras 3 runs on PyTorch without TensorFlow (KERAS_BACKEND=torch,
#:   set below);
#: - ``tf_engine``-marked (TensorFlow on hvdrunner's engine, and the compiled horovod beside
#:   it): 18, which has TensorFlow, torch and (under `make test`) a compiled horovod;
#: - ``stacks("19", "gpu")`` on a ``torch`` test: also on the gpu stack, whose horovod is
#:   the CUDA + NCCL build - its CPU paths must give what the CPU build gives;
#: - ``stacks("15.4", "16.4", "17.3", "18", "19")``: every replica. 16.4 and 17.3 run only
#:   such tests (a runtime's smoke test: the replica's packages, the doctor, 2-rank Keras
#:   and PyTorch jobs with MLflow); the whole suite runs on the oldest and newest replicas;
#: - ``stacks("15.4", ...)``: the stacks named - a test about what differs between them
#:   (Spark 3.5 vs 4.x, pyarrow 14 vs 21, MLflow 2.13 vs 3.x, real petastorm, the stack's
#:   own horovod build), or one half of a module split between them (the two-host cluster's name modes);
#: - anything else is framework-independent (the launcher, notebooks, the bundle, faults):
#:   it runs once, on HOME_STACK, the default stack.
#: The stack is the Makefile's ``STACK``; without it (a bare ``pytest``) or with
#: ``HVDRUNNER_TESTS=all`` (``make test-all``) every test the installed frameworks allow runs.
KERAS_ON_TORCH = _keras_on_torch()
if KERAS_ON_TORCH:
    os.environ.setdefault("KERAS_BACKEND", "torch")

HOME_STACK = "18"
STACKS = ("15.4", "16.4", "17.3", "18", "19", "gpu")
TF_STACKS = ("15.4", "18")


def selected_stack() -> str | None:
    """The stack whose tests `make test` runs, or None for every test (see above)."""
    stack = os.environ.get("STACK", "")
    if stack and stack not in STACKS:
        raise pytest.UsageError(f"STACK={stack!r}: expected one of {STACKS}")
    return None if not stack or os.environ.get("HVDRUNNER_TESTS", "") == "all" else stack


#: CI runs one stage in two parts (.ci/run): ``background`` - the tests marked ``background``,
#: which assert no time bound and so may run at the lowest priority beside another stack's
#: suite - and ``foreground``, the rest. Unset (`make test`), the stage runs whole.
PART_ENV = "HVDRUNNER_TEST_PART"
PARTS = ("background", "foreground")


def selected_part() -> str | None:
    """The part of the stage to run (``PART_ENV``), or None for all of it."""
    part = os.environ.get(PART_ENV, "")
    if part and part not in PARTS:
        raise pytest.UsageError(f"{PART_ENV}={part!r}: expected one of {PARTS}")
    return part or None


def stacks_of(item: pytest.Item) -> tuple[str, ...]:
    """The stacks a test runs on under `make test` (see above)."""
    named = item.get_closest_marker("stacks")
    if named is not None:
        unknown = set(named.args) - set(STACKS)
        if unknown or not named.args:
            raise pytest.UsageError(f"{item.nodeid}: stacks{named.args} names no stack of {STACKS}")
        return tuple(named.args)
    if item.get_closest_marker("torch") is not None:
        return ("19",)
    if item.get_closest_marker("tf_engine") is not None:
        return ("18",)
    if item.get_closest_marker("keras") is not None:
        on_torch = item.get_closest_marker("keras_torch") is not None
        return (*TF_STACKS, "19") if on_torch else TF_STACKS
    return (HOME_STACK,)


def pytest_sessionstart(session: pytest.Session) -> None:
    """A test killed inside ``unpatched_horovod.marker_hidden`` left this venv's horovod
    looking unpatched: put it back before anything runs."""
    if _installed("horovod"):
        from helpers.unpatched_horovod import restore_hidden

        for path in restore_hidden():
            print(f"restored {path.name}, hidden by a test that was killed", file=sys.stderr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Select by the stack's framework, decided by what is *installed*, never by an import,
    then (under `make test`) by where each test adds information (``stacks_of``).

    A stack without TensorFlow (19) runs the tests marked ``torch`` and nothing else; the
    TensorFlow stacks (no torch) run everything else. A venv with both runs everything. A
    framework that is installed but broken is selected and so fails - it never skips.
    """
    has_tf, has_torch = _installed("tensorflow"), _installed("torch")
    keras_on_torch = KERAS_ON_TORCH
    stack, part = selected_stack(), selected_part()
    keep, drop = [], []
    for item in items:
        is_torch = item.get_closest_marker("torch") is not None
        if is_torch:
            framework = has_torch
        elif item.get_closest_marker("tf_engine") is not None:
            framework = has_tf and has_torch
        elif item.get_closest_marker("keras_torch") is not None:
            framework = has_tf or keras_on_torch
        else:
            framework = has_tf
        if item.get_closest_marker("streaming") is not None:  # hvdrunner.streaming's tests
            framework = framework and _installed("mosaicml-streaming")
        runs = framework and (stack is None or stack in stacks_of(item))
        if part is not None:
            background = item.get_closest_marker("background") is not None
            runs = runs and background == (part == "background")
        (keep if runs else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests' JVMs map Spark's classes from this venv's class-data archive, made here
    once a stage runs enough tests to earn it back (tests/helpers/spark_classes.py). Not
    where JVM options were set by hand, nor for a collection that runs nothing."""
    if session.config.option.collectonly or any(os.environ[v] != C1_ONLY for v in JVM_OPTIONS):
        return
    from helpers.spark_classes import MIN_TESTS, QUIET, archive

    jsa = archive(make=len(session.items) >= MIN_TESTS)
    if jsa is not None:
        for var in JVM_OPTIONS:
            os.environ[var] = f"{C1_ONLY} -XX:SharedArchiveFile={jsa} {QUIET}"


#: Where a stage records what its tests did, for the support matrix (scripts/support_matrix.py;
#: `.ci/run` sets it): one file per stage, each test id's outcome.
RESULTS_ENV = "HVDRUNNER_RESULTS_DIR"
_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test's outcome: failed if any phase failed, else skipped or passed by its call."""
    if _outcomes.get(report.nodeid) == "failed":
        return
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped:
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call":
        _outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under `make test` with ``HVDRUNNER_RESULTS_DIR`` set: write this stage's results."""
    folder, stack = os.environ.get(RESULTS_ENV), selected_stack()
    if not folder or stack is None or not _outcomes:
        return
    import json

    from hvdrunner import _versions

    mode = "-tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else ""
    part = selected_part()
    backend = os.environ.get("KERAS_BACKEND", "tensorflow") if _installed("keras") else None
    versions = {d: _versions.version(d) for d in ("tensorflow", "keras", "torch", "pyspark",
                                                   "mlflow-skinny")}  # fmt: skip
    stage = {"stack": stack, "mode": mode.strip("-") or None, "keras_backend": backend,
             "versions": versions, "outcomes": _outcomes}  # fmt: skip
    Path(folder).mkdir(parents=True, exist_ok=True)
    name = f"{stack}{mode}{f'-{part}' if part else ''}.json"  # a part's beside the other's
    (Path(folder) / name).write_text(json.dumps(stage, indent=1) + "\n")


def pytest_report_header(config: pytest.Config) -> str:
    frameworks = [d for d in ("tensorflow", "torch") if _installed(d)]
    stack = selected_stack()
    scope = "every test" if stack is None else f"the tests of stack {stack}"
    return f"hvdrunner stack frameworks: {', '.join(frameworks) or 'none'}; running {scope}"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from hvdrunner.spark import local_session

    session = local_session("local[2]", app_name="hvdrunner-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite database with every migration applied, made once per session.

    Creating one runs MLflow's ~50 alembic migrations (3-6 s here); each test gets a copy
    (0.2 s), so every test still has a store of its own.
    """
    import mlflow

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_db(tmp_path: Path, empty_mlflow_db: Path) -> str:
    """The sqlite tracking URI a test's subprocesses use (notebooks, the stand-in's tasks): a
    copy of the migrated database at ``tmp_path/mlflow.db``, as a workspace's tracking server
    is there before a job runs (a new file costs its first process MLflow's migrations)."""
    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


#: Where MLflow keeps a registry URI once set: its module global, and (MLflow 3) an
#: environment variable every later subprocess inherits.
REGISTRY_ENV = "MLFLOW_REGISTRY_URI"


@pytest.fixture(autouse=True)
def registry_isolated() -> Iterator[None]:
    """No test's registry URI outlives it. ``mlflow.set_registry_uri`` sets a module global and,
    on MLflow 3, ``MLFLOW_REGISTRY_URI`` in this process's environment, which every later
    subprocess (the stand-in's tasks, the ranks) inherits; "restoring" it with
    ``get_registry_uri()`` pins the tracking URI that resolved to. Both are put back as they
    were (MLflow's module global: private, read and written here only)."""
    try:
        from mlflow.tracking._model_registry import utils as registry_utils
    except ImportError:  # a stack without MLflow has no registry to leak
        yield
        return
    saved, saved_env = registry_utils._registry_uri, os.environ.get(REGISTRY_ENV)
    yield
    registry_utils._registry_uri = saved
    if saved_env is None:
        os.environ.pop(REGISTRY_ENV, None)
    else:
        os.environ[REGISTRY_ENV] = saved_env


@pytest.fixture()
def store(tmp_path: Path, tracking_db: str):
    """A real MLflow sqlite store and experiment under tmp_path; yields (tmp_path, exp id)."""
    import mlflow

    uri = tracking_db
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)  # the registry of this store (registry_isolated restores it)
    exp = mlflow.create_experiment("hvdrunner-tests", artifact_location=str(tmp_path / "artifacts"))
    mlflow.set_experiment(experiment_id=exp)
    yield tmp_path, exp
    left = mlflow.active_run()
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)
    # docs/faults.md promises no run is left RUNNING: a test that leaves one active has found
    # that bug (ended here so the next test starts clean, then reported).
    if left is not None:
        pytest.fail(f"the test left MLflow run {left.info.run_id} active (RUNNING)")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tmp data cache (hvdrunner.data.prepare) shared by the session's tests."""
    return str(tmp_path_factory.mktemp("data-cache"))


#: Every process this test session starts inherits the marker - ranks of subprocess tests
#: (cluster, notebook CLI, demo, the multi-host hosts) too - so leftovers are found by it,
#: not by parentage (a rank whose parent died is re-parented to init).
SESSION_ENV = "HVDRUNNER_TEST_SESSION"
os.environ[SESSION_ENV] = f"{os.getpid()}-{time.time_ns()}"


def rank_processes() -> list[psutil.Process]:
    """Live hvdrunner rank processes started by this test session, anywhere on the machine."""
    out = []
    for proc in psutil.process_iter():
        try:
            if WORKER_MODULE not in " ".join(proc.cmdline()):
                continue
            if proc.environ().get(SESSION_ENV) == os.environ[SESSION_ENV]:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


@pytest.fixture()
def marks(tmp_path: Path) -> Path:
    """A folder for helpers/restart_marks.py's marks."""
    (tmp_path / "marks").mkdir()
    return tmp_path / "marks"


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every time a job asked the launch seam where to run its ranks (``backends.choose``):
    "nothing was launched" is this list staying empty - looked at, not timed."""
    from hvdrunner._launch import backends

    calls: list[int] = []
    real = backends.choose

    def recording(np: int) -> object:
        calls.append(np)
        return real(np)

    monkeypatch.setattr(backends, "choose", recording)
    return calls


@pytest.fixture(autouse=True)
def no_orphan_ranks() -> Iterator[None]:
    """Every test must leave no rank process behind, whatever it did."""
    yield
    deadline = time.monotonic() + 3  # a rank already told to stop may take a moment
    while (leftovers := rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in leftovers:
        proc.kill()
    assert not leftovers, f"rank processes left behind: {[p.pid for p in leftovers]}"
