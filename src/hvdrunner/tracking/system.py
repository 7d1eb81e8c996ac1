"""MLflow's system metrics across a Horovod job, switched on as MLflow switches them on: with
``mlflow.enable_system_metrics_logging()`` (or ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true``)
on the driver, the first rank of every host logs its host's CPU, memory, disk, network and
GPU metrics (one series per GPU: each rank's own) into the job's run as
``system/node_<host>/...``, beside the driver's own ``system/...``. One monitor per host, not
per rank: the ranks of a host share its CPUs and report the same numbers.

The one exception to "only rank 0 writes": those metrics, from each host's first rank, asked
for by the switch. The driver hands the switch and MLflow's ``MLFLOW_SYSTEM_METRICS_*``
settings to the ranks (:func:`hvdrunner.tracking.driver_context`); the rank hooks
:func:`start` and :func:`stop` run around the job's function. MLflow before 2.8 has no
system metrics: nothing is logged there.

Example (notebook):
    >>> mlflow.enable_system_metrics_logging()          # doctest: +SKIP
    >>> with mlflow.start_run():                        # doctest: +SKIP
    ...     HorovodRunner(np=2).run(train)              # system/node_0/..., system/node_1/...
"""

from __future__ import annotations

import os
from typing import Any

from hvdrunner._logging import get_logger
from hvdrunner.distributed import cross_rank, local_rank
from hvdrunner.tracking.ranks import run_id

#: MLflow's own switch, and the prefix of its system-metrics settings.
SWITCH = "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"
SETTINGS_PREFIX = "MLFLOW_SYSTEM_METRICS_"
_monitor: Any = None
_log = get_logger()


def switched_on(env: dict[str, str] | None = None) -> bool:
    """Whether MLflow's system-metrics switch is on in ``env`` (default: this process's).

    Example:
        >>> switched_on({"MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "true"})
        True
    """
    value = (os.environ if env is None else env).get(SWITCH, "")
    return value.strip().lower() in ("true", "1")


def settings(env: dict[str, str] | None = None) -> dict[str, str]:
    """What the ranks need of the driver's environment: the switch and MLflow's settings for
    it (sampling interval, samples per log), when the switch is on; else nothing.

    Example:
        >>> settings({"MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false"})
        {}
    """
    env = dict(os.environ if env is None else env)
    if not switched_on(env):
        return {}
    return {k: v for k, v in env.items() if k == SWITCH or k.startswith(SETTINGS_PREFIX)}


def start() -> None:
    """Rank hook: on each host's first rank of a job with a run and the switch on, start
    MLflow's monitor for this host (``system/node_<host>/``).

    Example:
        >>> start()  # outside a job: no run handed down, nothing started
    """
    global _monitor
    run = run_id()
    if _monitor is not None or local_rank() != 0 or not run or not switched_on():
        return
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError:  # MLflow before 2.8
        return
    try:
        monitor = SystemMetricsMonitor(run, node_id=f"node_{cross_rank()}")
        monitor.start()
    except Exception as exc:  # noqa: BLE001 - metrics about the job never stop the job
        _log.warning(f"system metrics of host {cross_rank()} not logged: {exc}")
        return
    _monitor = monitor


def stop() -> None:
    """Rank hook: log the last samples and stop the monitor (a no-op where none runs).

    Example:
        >>> stop()
    """
    global _monitor
    if _monitor is not None:
        _monitor.finish()
        _monitor = None
