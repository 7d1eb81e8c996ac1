"""Score a logged MLflow model in a fresh interpreter where ``horovod`` and ``hvdrunner``
cannot be imported - what a serving cluster without them sees."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

LOAD_WITHOUT_HOROVOD = """
import json, sys
import numpy as np
sys.modules["horovod"] = None  # as if not installed: any import of it fails
sys.modules["hvdrunner"] = None
import mlflow
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
x = np.array(json.loads(sys.argv[3]), dtype="float32")
print("PRED " + json.dumps(np.argmax(np.asarray(model.predict(x)), axis=1).tolist()))
"""


def predict_without_horovod(tracking_uri: str, model_uri: str, rows: Any) -> list[int]:
    """The arg-max class of each row, as the model predicts it there; fails with the output."""
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_HOROVOD, tracking_uri, model_uri, json.dumps(rows)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PRED ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return list(json.loads(lines[0][5:]))
