"""Trained models into the job's run (rank 0): Keras via ``mlflow.tensorflow``, PyTorch via
``mlflow.pytorch``, each with a signature, loadable where neither horovod nor hvdrunner is."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from hvdrunner import _versions
from hvdrunner.tracking.runs import rank0_client, run_id


def _save_kwargs(keras_mode: str) -> dict[str, Any]:
    """How to save a trained model so that it loads where horovod/hvdrunner are absent.

    - keras2 (TF 2.15): without the optimizer (its graph would hold Horovod ops).
    - tf_keras (TF >= 2.16): MLflow saves ``.keras`` by default, which rejects
      ``include_optimizer``; h5 without the optimizer loads and predicts anywhere.
    - keras3: ``.keras``; the optimizer is saved under its own class (hvdrunner's subclass
      keeps the base's name and module), so it loads with plain Keras.
    """
    if keras_mode == "keras3":
        return {}
    if keras_mode == "tf_keras":
        return {"save_format": "h5", "include_optimizer": False}
    return {"include_optimizer": False}


def _log_saved(
    save: Callable[[str], None], artifact_path: str, registered_name: str | None
) -> str | None:
    """``save(dir)`` writes an MLflow model; it goes into the job's run (rank 0); its URI."""
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


def log_model(
    model: Any, input_example: Any, artifact_path: str = "model", registered_name: str | None = None
) -> str | None:
    """Log a Keras model with its signature (from ``input_example``); rank 0 only.

    Returns the model URI (``runs:/<run>/<artifact_path>``) on rank 0, ``None`` elsewhere.
    The model loads with ``mlflow.pyfunc.load_model`` / ``mlflow.pyfunc.spark_udf``.
    ``registered_name`` also registers it (a three-level Unity Catalog name on Databricks).
    """
    if rank0_client() is None:
        return None

    def save(path: str) -> None:
        import mlflow
        from mlflow.models import infer_signature

        signature = infer_signature(input_example, model.predict(input_example, verbose=0))
        mlflow.tensorflow.save_model(
            model, path, signature=signature, input_example=input_example,
            keras_model_kwargs=_save_kwargs(_versions.mode()),
        )  # fmt: skip

    return _log_saved(save, artifact_path, registered_name)


class _LocalLabelFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "contains a local version label" not in record.getMessage()


@contextlib.contextmanager
def _without_local_label_warning() -> Iterator[None]:
    """MLflow warns that torch's ``+cpu``/``+cu124`` label is dropped from the model's pip
    requirements, once per save: expected for every torch wheel, not news to a user."""
    logger = logging.getLogger("mlflow.utils.requirements_utils")
    quiet = _LocalLabelFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def log_pytorch_model(
    model: Any, input_example: Any, artifact_path: str = "model", registered_name: str | None = None
) -> str | None:
    """Log a torch ``nn.Module`` with ``mlflow.pytorch`` and a signature; rank 0 only.

    ``input_example``: a numpy array (or dict of arrays) of a few input rows. The model is
    saved from a CPU copy in eval mode, so it loads (``mlflow.pyfunc.load_model``,
    ``spark_udf``) on machines without a GPU, horovod or hvdrunner.
    """
    if rank0_client() is None:
        return None

    def save(path: str) -> None:
        import copy

        import mlflow.pytorch
        import torch
        from mlflow.models import infer_signature

        cpu = copy.deepcopy(model).to("cpu").eval()
        with torch.no_grad():
            inputs = (
                {k: torch.as_tensor(v) for k, v in input_example.items()}
                if isinstance(input_example, dict)
                else torch.as_tensor(input_example)
            )
            output = cpu(**inputs) if isinstance(inputs, dict) else cpu(inputs)
        signature = infer_signature(input_example, output.numpy())
        with _without_local_label_warning():
            mlflow.pytorch.save_model(cpu, path, signature=signature, input_example=input_example)

    return _log_saved(save, artifact_path, registered_name)
