"""A saved MLflow model into the job's run (rank 0): the framework-neutral half of model
logging. Each framework's own half lives with its adapter: ``hvdrunner.keras.log_model``
(``mlflow.tensorflow``), ``hvdrunner.torch.log_model`` (``mlflow.pytorch``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from hvdrunner.tracking.runs import rank0_client, run_id


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
