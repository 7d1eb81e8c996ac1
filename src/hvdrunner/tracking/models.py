"""A saved MLflow model into the job's run (rank 0): the framework-neutral half of model
logging. Each framework's own half lives with its adapter: ``hvdrunner.keras.log_model``
(``mlflow.tensorflow``), ``hvdrunner.torch.log_model`` (``mlflow.pytorch``)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator

from hvdrunner.tracking.ranks import rank0_client, run_id


def log_saved(
    save: Callable[[str], None], artifact_path: str, registered_name: str | None
) -> str | None:
    """``save(dir)`` writes an MLflow model; it goes into the job's run (rank 0); its URI.

    Returns ``None`` on other ranks and when the driver had no active run (nothing saved).

    Example:
        >>> log_saved(lambda path: mlflow.pyfunc.save_model(path, ...), "model", None)  # doctest: +SKIP
        'runs:/0a1b.../model'
    """
    client = rank0_client()
    if client is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, artifact_path)
        save(path)
        client.log_artifacts(run_id(), path, artifact_path=artifact_path)
    uri = f"runs:/{run_id()}/{artifact_path}"
    if registered_name:
        import mlflow

        mlflow.register_model(uri, registered_name)
    return uri


def latest_model(experiment: str, artifact_path: str = "model") -> tuple[str, str] | None:
    """``(model URI, run id)`` of the newest finished run of ``experiment`` that logged a model
    at ``artifact_path``; None if there is none. How a notebook opened by hand finds what the
    training notebook wrote (a job passes it as task values).

    Example:
        >>> latest_model("hvdrunner-digits")  # doctest: +SKIP
        ('runs:/0a1b.../model', '0a1b...')
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id],
        filter_string="attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=20,
    )
    for run in runs:
        if artifact_path in {a.path for a in client.list_artifacts(run.info.run_id)}:
            return f"runs:/{run.info.run_id}/{artifact_path}", run.info.run_id
    return None


class _LocalLabelFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "contains a local version label" not in record.getMessage()


@contextlib.contextmanager
def without_local_label_warning() -> Iterator[None]:
    """MLflow warns that torch's ``+cpu``/``+cu124`` label is dropped from the model's pip
    requirements, once per save of a model that needs torch (``mlflow.pytorch``, or Keras on
    PyTorch): expected for every torch wheel, not news to a user.

    Example:
        >>> with without_local_label_warning():
        ...     pass
    """
    logger = logging.getLogger("mlflow.utils.requirements_utils")
    quiet = _LocalLabelFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
