"""The driver half of the job's MLflow run: the run opened (or resumed) around a job, handed to
the ranks, marked FAILED with the error when the job fails, and metrics logged to a run by id
(scoring). The rank half: :mod:`hvdrunner.tracking.ranks`."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from hvdrunner._logging import get_logger
from hvdrunner._secrets import scrub
from hvdrunner.errors import TrackingError
from hvdrunner.tracking.ranks import EXPERIMENT_ID_ENV, RUN_ID_ENV
from hvdrunner.tracking.system import settings as system_settings

ERROR_TAG = "hvdrunner.error"
_log = get_logger()


def _databricks_credentials() -> dict[str, str]:
    """Workspace host and token from the notebook context (Databricks only; else empty)."""
    if "DATABRICKS_RUNTIME_VERSION" not in os.environ:
        return {}
    try:
        from databricks.sdk.runtime import dbutils

        ctx = dbutils.notebook.entry_point.getDbutils().notebook().getContext()  # type: ignore[union-attr,unused-ignore]
        return {"DATABRICKS_HOST": ctx.apiUrl().get(), "DATABRICKS_TOKEN": ctx.apiToken().get()}
    except Exception:  # noqa: BLE001 - a job cluster without a notebook context
        return {}


def driver_context() -> dict[str, str]:
    """Environment for the ranks: the active run and its store, or nothing without a run."""
    try:
        import mlflow
    except ImportError:
        return {}
    run = mlflow.active_run()
    if run is None:
        return {}
    _check_run_in_store(run.info.run_id, mlflow.get_tracking_uri())
    env = {
        "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri(),
        "MLFLOW_REGISTRY_URI": mlflow.get_registry_uri(),
        RUN_ID_ENV: run.info.run_id,
        EXPERIMENT_ID_ENV: run.info.experiment_id,
    }
    env.update(_databricks_credentials())
    env.update(system_settings())  # MLflow's system-metrics switch, when on (tracking.system)
    return env


def is_unity_catalog_name(name: str) -> bool:
    """Whether ``name`` is a three-level ``<catalog>.<schema>.<model>`` name.

    Example:
        >>> is_unity_catalog_name("main.ml.digits"), is_unity_catalog_name("digits")
        (True, False)
    """
    parts = name.split(".")
    return len(parts) == 3 and all(parts)


def is_workspace_registry(registry_uri: str) -> bool:
    """Whether ``registry_uri`` is Databricks' workspace registry (not Unity Catalog's).

    Example:
        >>> is_workspace_registry("databricks"), is_workspace_registry("databricks-uc")
        (True, False)
    """
    return registry_uri.startswith("databricks") and not registry_uri.startswith("databricks-uc")


def check_registered_model_name(name: str | None, registry_uri: str | None = None) -> None:
    """Refuse a model name the registry would refuse, on the driver, before any rank starts.

    Unity Catalog (registry ``databricks-uc``; MLflow 3's default on Databricks) needs
    ``<catalog>.<schema>.<model>``; the workspace registry (``databricks``, MLflow 2's default
    there) rejects such a three-level name. Without this, the error comes after training.

    Raises:
        ValueError: naming the argument, the registry and the fix.

    Example:
        >>> check_registered_model_name("main.ml.digits", registry_uri="databricks-uc")
    """
    if name is None:
        return
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"registered_model_name must be a non-empty string or None, got {name!r}")
    if registry_uri is None:
        import mlflow

        registry_uri = mlflow.get_registry_uri() or ""
    three_level = is_unity_catalog_name(name)
    if registry_uri.startswith("databricks-uc") and not three_level:
        raise ValueError(
            f"registered_model_name={name!r}: the Unity Catalog registry ({registry_uri}) needs "
            f"a three-level name <catalog>.<schema>.<model>, e.g. "
            f"'main.default.{name.split('.')[-1]}'"
        )
    if is_workspace_registry(registry_uri) and three_level:
        raise ValueError(
            f"registered_model_name={name!r} is a Unity Catalog name, but the registry is the "
            f"workspace registry ({registry_uri}): call mlflow.set_registry_uri('databricks-uc') "
            f"before the run, or pass a workspace model name without dots"
        )


#: Bounds on each tracking-server call made while recording a failure.
FAILURE_HTTP_TIMEOUT_S = "10"
FAILURE_HTTP_RETRIES = "0"


@contextlib.contextmanager
def _bounded_http() -> Iterator[None]:
    """MLflow REST calls in this block time out fast and are not retried (read per call)."""
    keys = {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": FAILURE_HTTP_TIMEOUT_S,
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": FAILURE_HTTP_RETRIES,
    }
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_run_in_store(run_id: str, uri: str) -> None:
    """The active run must be in the store the ranks will write to: checked once, bounded,
    before launch - not found by rank 0 after training (then its work would be lost)."""
    from mlflow import MlflowClient

    try:
        with _bounded_http():
            MlflowClient(tracking_uri=uri).get_run(run_id)
    except Exception as exc:  # noqa: BLE001 - MLflow raises many types for one cause
        raise TrackingError(
            f"the active MLflow run {run_id} is not reachable in the tracking store at {uri} "
            f"({type(exc).__name__}: {str(exc)[:200]}): rank 0 could not log into it. Check "
            f"that the server is up; if the tracking URI changed after mlflow.start_run(), "
            f"set it back (mlflow.set_tracking_uri) or end that run and start one in the "
            f"new store."
        ) from exc


def mark_failed(error_summary: str, secrets: list[str]) -> None:
    """End the driver's active run FAILED with the error summary as a tag (no-op without one).

    Never raises: the job's own error is what the caller must see. When the tracking
    server cannot record the failure (down, experiment deleted) a warning is printed, and
    the run is still removed from this process's active-run stack so that the next
    ``mlflow.start_run()`` in the notebook works.
    """
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return
    try:
        with _bounded_http():
            mlflow.set_tag(ERROR_TAG, scrub(error_summary, secrets)[:4000])
            mlflow.end_run(status="FAILED")
    except Exception as exc:  # noqa: BLE001 - reported, never replaces the job's error
        _log.warning(
            f"could not mark MLflow run {run.info.run_id} FAILED "
            f"({type(exc).__name__}: {scrub(str(exc), secrets)[:500]}); it may show RUNNING "
            f"in the tracking server. The job's own error follows."
        )
    finally:
        _forget_active_run(run.info.run_id)


#: The run's restart count (tag and metric); each restart's cause is tag ``hvdrunner.attempt.N``.
RESTARTS_TAG = "hvdrunner.restarts"


def note_restart(
    track_env: Mapping[str, str], restarts: int, cause: str, secrets: list[str]
) -> None:
    """Driver side: record restart number ``restarts`` and the failure that caused it in the
    job's run (``track_env`` from :func:`driver_context`; a no-op without a run).

    Never raises: a tracking server that is down costs a warning, not the restart.
    """
    run = track_env.get(RUN_ID_ENV)
    if not run:
        return
    try:
        from mlflow import MlflowClient
        from mlflow.entities import Metric, RunTag

        tags = [RunTag(RESTARTS_TAG, str(restarts)),
                RunTag(f"hvdrunner.attempt.{restarts}", scrub(cause, secrets)[:4000])]  # fmt: skip
        metric = Metric(RESTARTS_TAG, float(restarts), int(time.time() * 1000), restarts)
        with _bounded_http():
            client = MlflowClient(tracking_uri=track_env.get("MLFLOW_TRACKING_URI"))
            client.log_batch(run, metrics=[metric], tags=tags, synchronous=True)
    except Exception as exc:  # noqa: BLE001 - reported, never stops the restart
        _log.warning(
            f"could not record restart {restarts} in MLflow run {run} ({type(exc).__name__}: "
            f"{scrub(str(exc), secrets)[:300]})"
        )


def _forget_active_run(run_id: str) -> None:
    """Drop ``run_id`` from MLflow's active-run stack (end_run may have failed half-way)."""
    import mlflow

    while (active := mlflow.active_run()) is not None and active.info.run_id == run_id:
        try:
            from mlflow.tracking import fluent

            # Private in MLflow: a list in 2.13 (15.4 LTS ML), a thread-local list in 3.x.
            stack = getattr(fluent, "_active_run_stack")  # noqa: B009
            (stack.get() if hasattr(stack, "get") else stack).pop()
        except Exception:  # noqa: BLE001 - MLflow internals moved: leave it
            return


@contextlib.contextmanager
def mlflow_run(
    experiment: str | None = None, run_name: str | None = None, tracking_uri: str | None = None,
    resume_key: str | None = None,
) -> Iterator[Any]:  # fmt: skip
    """Start an MLflow run for a job when the notebook has none; ends FAILED on error.

    ``resume_key``: the run continues the experiment's run tagged with the same key, if
    there is one, instead of starting another: a job's task retry (which runs the notebook
    again) passes its job run id (``{{job.run_id}}``) and continues the run its first try
    started, with ``fit(checkpoint_dir=...)`` resuming from that try's checkpoint (every
    epoch's metrics once). Keys are letters, digits, ``._-``.

    Raises:
        ValueError: a ``resume_key`` with other characters.
        TrackingError: the tracking server is unreachable or refuses the run (bounded:
            seconds, one try), naming the URI and the fix.

    Example:
        >>> with mlflow_run(experiment="digits", run_name="np2"):   # doctest: +SKIP
        ...     HorovodRunner(np=2).run(train)
    """
    import mlflow

    if resume_key is not None and not _RESUME_KEY.fullmatch(resume_key):
        raise ValueError(
            f"resume_key={resume_key!r}: use letters, digits and ._- only (a job run id, "
            f"{{{{job.run_id}}}} in a job's parameters, is one)."
        )
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    uri = mlflow.get_tracking_uri()
    try:
        with _bounded_http():  # a server that is down fails in seconds, not MLflow's minutes
            if experiment:
                mlflow.set_experiment(experiment)
            active = _start(mlflow, run_name, resume_key)
    except Exception as exc:  # noqa: BLE001 - MLflow raises many types for one cause
        raise TrackingError(
            f"MLflow tracking at {uri} could not start a run ({type(exc).__name__}: "
            f"{str(exc)[:300]}): check that the server is up and the URI is right "
            f"(tracking_uri= or MLFLOW_TRACKING_URI), or log locally with "
            f"tracking_uri='sqlite:///mlflow.db'"
        ) from exc
    with active as run:
        yield run
    if uri.startswith("sqlite:"):
        _log.info(f"view the run: mlflow ui --backend-store-uri {uri}")


RESUME_KEY_TAG = "hvdrunner.resume_key"
_RESUME_KEY = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _start(mlflow: Any, run_name: str | None, resume_key: str | None) -> Any:
    """A new run, or the one of ``resume_key`` in the current experiment (newest first)."""
    if not resume_key:
        return mlflow.start_run(run_name=run_name)
    from mlflow.tracking.fluent import _get_experiment_id

    found = mlflow.MlflowClient().search_runs(
        [_get_experiment_id()], filter_string=f"tags.`{RESUME_KEY_TAG}` = '{resume_key}'",
        max_results=1, order_by=["attributes.start_time DESC"],
    )  # fmt: skip
    if not found:
        return mlflow.start_run(run_name=run_name, tags={RESUME_KEY_TAG: resume_key})
    _log.info(f"continuing MLflow run {found[0].info.run_id} of resume_key={resume_key} "
              f"(it was {found[0].info.status})")  # fmt: skip
    return mlflow.start_run(run_id=found[0].info.run_id)


def log_to_run(run_id: str, metrics: Mapping[str, float]) -> None:
    """Log ``metrics`` to the run ``run_id`` from the driver (a scoring job's accuracy into
    the training run).

    Example:
        >>> log_to_run(run.info.run_id, {"test_accuracy": 0.96})  # doctest: +SKIP
    """
    from mlflow import MlflowClient

    client = MlflowClient()
    for key, value in metrics.items():
        client.log_metric(run_id, key, float(value))
