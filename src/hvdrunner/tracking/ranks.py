"""The rank half of the job's MLflow run: rank 0 writes into the run the driver handed down
(through the rank processes' environment); every other rank, and a job without a run, writes
nothing (see the package doc)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from hvdrunner._logging import get_logger
from hvdrunner.distributed import is_rank0

#: What the driver hands down (tracking.driver.driver_context) and the ranks read.
RUN_ID_ENV = "HVDRUNNER_MLFLOW_RUN_ID"
EXPERIMENT_ID_ENV = "HVDRUNNER_MLFLOW_EXPERIMENT_ID"
_log = get_logger()


def run_id() -> str | None:
    """The run rank 0 writes to, or ``None`` when the driver had no active run."""
    return os.environ.get(RUN_ID_ENV) or None


def rank0_client() -> Any | None:
    """An MlflowClient on rank 0 when the driver handed down a run; ``None`` elsewhere."""
    if not is_rank0() or run_id() is None:
        return None
    from mlflow import MlflowClient

    return MlflowClient()


def log_params(params: Mapping[str, Any]) -> None:
    """Log params to the job's run (rank 0 only; a no-op elsewhere or without a run)."""
    client = rank0_client()
    if client is None:
        return
    from mlflow.entities import Param, RunTag

    # A retried or resumed job logs into the same run again: params already there with the
    # same value are skipped; a changed value (MLflow params are immutable) is kept as a tag
    # `param_changed.<key>` and reported, instead of failing the job.
    existing = client.get_run(run_id()).data.params
    new = {k: str(v) for k, v in params.items() if k not in existing}
    changed = {k: str(v) for k, v in params.items() if k in existing and existing[k] != str(v)}
    if changed:
        _log.warning(
            f"params changed since this run first logged them (kept as "
            f"param_changed.* tags): {changed}"
        )
    client.log_batch(
        run_id(),
        params=[Param(k, v) for k, v in new.items()],
        tags=[RunTag(f"param_changed.{k}", v) for k, v in changed.items()],
        synchronous=True,
    )


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log metrics at ``step`` (rank 0 only). Average across ranks *before* calling this."""
    client = rank0_client()
    if client is not None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        client.log_batch(
            run_id(),
            metrics=[Metric(k, float(v), now, step or 0) for k, v in metrics.items()],
            synchronous=True,
        )


def logged_steps() -> set[tuple[str, int]]:
    """Every ``(metric, step)`` the job's run holds (rank 0 with a run; else empty)."""
    client = rank0_client()
    if client is None:
        return set()
    keys = client.get_run(run_id()).data.metrics.keys()
    return {(k, m.step) for k in keys for m in client.get_metric_history(run_id(), k)}


def set_tags(tags: Mapping[str, Any]) -> None:
    """Set tags on the job's run (rank 0 only)."""
    client = rank0_client()
    if client is not None:
        from mlflow.entities import RunTag

        client.log_batch(
            run_id(), tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True
        )


def autolog(**kwargs: Any) -> None:
    """Turn on ``mlflow.tensorflow.autolog(**kwargs)`` on rank 0 only, into the job's run.

    Other ranks (and jobs without a driver run) do nothing, so autolog never opens a run per
    rank. Put Horovod's ``MetricAverageCallback`` in your callbacks so the autologged epoch
    metrics are averages over ranks.
    """
    if rank0_client() is None:
        return
    import mlflow

    if mlflow.active_run() is None:
        # Resume the driver's run in this process; it is never ended here (the rank exits
        # without running mlflow's atexit hook), so its status stays the driver's to set.
        mlflow.start_run(run_id=run_id())
    mlflow.tensorflow.autolog(**kwargs)
