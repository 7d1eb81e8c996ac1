"""A trained Keras model into the job's MLflow run (rank 0): with ``mlflow.tensorflow`` on
TensorFlow, ``mlflow.keras`` (Keras 3's ``.keras`` file) on the PyTorch backend; with its
signature, loadable where neither horovod nor hvdrunner is installed."""

from __future__ import annotations

import os
from typing import Any

from hvdrunner import _versions
from hvdrunner.keras import backend
from hvdrunner.tracking.models import log_saved, without_local_label_warning
from hvdrunner.tracking.ranks import rank0_client


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


def log_model(
    model: Any, input_example: Any, artifact_path: str = "model", registered_name: str | None = None
) -> str | None:
    """Log a Keras model with its signature (from ``input_example``); rank 0 only.

    Returns the model URI (``runs:/<run>/<artifact_path>``) on rank 0, ``None`` elsewhere.
    The model loads with ``mlflow.pyfunc.load_model`` / ``mlflow.pyfunc.spark_udf``.
    ``registered_name`` also registers it (a three-level Unity Catalog name on Databricks).
    """
    if rank0_client() is None:  # not rank 0, or no run: skip the predict
        return None

    def save(path: str) -> None:
        import mlflow
        from mlflow.models import infer_signature

        signature = infer_signature(input_example, model.predict(input_example, verbose=0))
        if backend.is_torch():  # a .keras file: loads on any Keras 3 backend
            import mlflow.keras

            os.makedirs(path)  # mlflow.keras writes the example before it makes the folder
            with without_local_label_warning():
                mlflow.keras.save_model(model, path, signature=signature,
                                        input_example=input_example)  # fmt: skip
            return
        mlflow.tensorflow.save_model(
            model, path, signature=signature, input_example=input_example,
            keras_model_kwargs=_save_kwargs(_versions.mode()),
        )  # fmt: skip

    return log_saved(save, artifact_path, registered_name)


__all__ = ["log_model"]
