"""MLflow across a Horovod job: one run, written by rank 0 only.

On the driver, :class:`HorovodRunner` hands the active MLflow run (tracking/registry URIs,
experiment and run ids) and, on Databricks, the workspace host and token to the ranks —
through the rank processes' environment only, over the job's authenticated channel, never
in the pickled payload, a file, a log line, a param or a tag. In the ranks, the helpers
below are safe on every rank: only rank 0 writes, and only when the driver had a run.
With no active run nothing is logged: no rank ever starts a run of its own.

Example (notebook):
    >>> import mlflow
    >>> with mlflow.start_run():                       # doctest: +SKIP
    ...     HorovodRunner(np=2).run(train)             # rank 0 logs into this run
"""

from typing import Any

from hvdrunner.tracking.driver import (
    ERROR_TAG,
    RESTARTS_TAG,
    check_registered_model_name,
    driver_context,
    log_to_run,
    mark_failed,
    mlflow_run,
    note_restart,
)
from hvdrunner.tracking.ranks import (
    EXPERIMENT_ID_ENV,
    RUN_ID_ENV,
    autolog,
    log_metrics,
    log_params,
    logged_steps,
    run_id,
    set_tags,
)
from hvdrunner.tracking.registry import check_model_alias, pin, registry_for, set_alias

__all__ = [
    "ERROR_TAG",
    "EXPERIMENT_ID_ENV",
    "RESTARTS_TAG",
    "RUN_ID_ENV",
    "autolog",
    "check_model_alias",
    "check_registered_model_name",
    "driver_context",
    "log_metrics",
    "log_params",
    "log_to_run",
    "logged_steps",
    "mark_failed",
    "mlflow_run",
    "note_restart",
    "pin",
    "registry_for",
    "run_id",
    "set_alias",
    "set_tags",
]

#: Model logging lives with its framework (so this package imports neither).
_MOVED = {
    "log_model": "hvdrunner.keras.log_model",
    "log_pytorch_model": "hvdrunner.torch.log_model",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        raise AttributeError(
            f"hvdrunner.tracking.{name} moved to {_MOVED[name]}: model logging lives with its "
            f"framework's adapter"
        )
    raise AttributeError(f"module 'hvdrunner.tracking' has no attribute {name!r}")
