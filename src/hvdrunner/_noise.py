"""What frameworks and libraries print in a rank that is not news to a user: the lines the
launcher keeps out of the notebook (they stay in a failing rank's error tail). The runner
hands these to the launcher (``TaskSpec.quiet``, ``quiet_without_gpu``), which itself knows
no framework."""

from __future__ import annotations

from collections.abc import Sequence

#: What TensorFlow prints while probing CUDA and CPU features on a machine without a GPU.
#: Shown to nobody there (still kept in the error tail); on a GPU node every line shows.
CPU_NOISE = (
    "failed call to cuInit", "Could not find cuda drivers on your machine",
    "Unable to register cuDNN factory", "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory", "TF-TRT Warning: Could not find TensorRT",
    "oneDNN custom operations are on", "This TensorFlow binary is optimized to use",
    "To enable the following instructions", "rebuild TensorFlow with the appropriate compiler",
    "All log messages before absl::InitializeLog() is called", "computation placer already registered",
    "cuda_executor.cc", "cudart_stub.cc",
)  # fmt: skip


#: Library chatter no user needs: never relayed (kept in the tail). First MLflow's sqlite
#: store narrating its schema migrations at INFO in every process that opens it (MLflow pins
#: the alembic logger at INFO; MLflow 2.13 and 3.8 format them differently).
CHATTER = (
    "INFO alembic.runtime.", "INFO  [alembic.", "INFO mlflow.store.db.utils:",
    # 15.4's setuptools (68, what the runtime ships) when something imports distutils: the warning
    # and its source line
    "Setuptools is replacing distutils",
    # TensorFlow loading a Keras 2 model saved without its optimizer, as tracking saves it
    # (the optimizer's graph would hold Horovod ops)
    "No training configuration found in save file",
    # TensorFlow starting a generator-fed dataset (a TransformSpec's decoded batches)
    "Memory patch applied: M_TRIM_THRESHOLD",
)  # fmt: skip


def noisy(text: str, markers: Sequence[str]) -> bool:
    """``text`` holds one of ``markers`` (e.g. :data:`CPU_NOISE`, :data:`CHATTER`).

    Example:
        >>> noisy("I0000 cudart_stub.cc:31] Could not find cuda drivers", CPU_NOISE)
        True
    """
    return any(marker in text for marker in markers)
