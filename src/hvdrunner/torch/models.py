"""A trained torch model into the job's MLflow run (rank 0) with ``mlflow.pytorch``: with its
signature, from a CPU copy, loadable where neither horovod nor hvdrunner is installed."""

from __future__ import annotations

from typing import Any

from hvdrunner.tracking.models import log_saved, without_local_label_warning
from hvdrunner.tracking.ranks import rank0_client


def log_model(
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
        with without_local_label_warning():
            mlflow.pytorch.save_model(cpu, path, signature=signature, input_example=input_example)

    return log_saved(save, artifact_path, registered_name)


__all__ = ["log_model"]
