"""A serverless GPU notebook, as far as one can exist here, running the code of one file.

What is real: Databricks' own launcher (``databricks.air``'s ``@distributed``: it pickles the
function, starts ``databricks.air.sgc_run``, which starts the ranks, and collects each rank's
result), the ranks on torch's CPU build over gloo, and an MLflow tracking server (the test
starts ``mlflow server``; the launcher's ``databricks`` tracking URI reaches it as
DATABRICKS_HOST, as it reaches the workspace's).

What is stood in for, because it cannot exist here:
- the notebook context (``dbutils``' workspace URL and token): the launcher reads them to tell
  the ranks where MLflow is; here they name the local tracking server;
- the GPUs: ``torch.cuda`` in this process reports 8 H100s, the node a serverless notebook
  attaches (the launcher counts results per 8-GPU node); the ranks see none and train on CPU;
- ``python`` on a login shell's PATH (the launcher starts ``bash -lc "python -m ..."``; the
  serverless image's ``python`` is the notebook's): the launch command names this interpreter.

Usage: python serverless_notebook.py CODE_FILE RESULT_JSON; the code's ``losses`` is written.
"""

from __future__ import annotations

import json
import os
import sys

import torch

LAUNCH = (
    f"{sys.executable} -m databricks.air.sgc_run -n {{nproc_per_node}} --world_size {{gpus}} "
    "--master_port {master_port} --master_addr {master_addr} --stdout {log_dir}/gpu_{rank}.txt"
)


def main(code_file: str, result_file: str) -> None:
    os.environ["DATABRICKS_INTERNAL_LAUNCH_CMD"] = LAUNCH
    import databricks.air.script as air_script

    air_script.get_databricks_credentials = lambda: (os.environ["DATABRICKS_HOST"], "stand-in")
    torch.cuda.device_count = lambda: 8  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *_: "NVIDIA H100 80GB HBM3"  # type: ignore[assignment]
    scope = {"__name__": "__main__"}
    with open(code_file) as f:
        exec(compile(f.read(), code_file, "exec"), scope)  # noqa: S102 - the doc under test
    with open(result_file, "w") as f:
        json.dump(scope["losses"], f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
