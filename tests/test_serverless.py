"""Serverless GPU: docs/pytorch.md's ``@distributed`` example, run as written under
Databricks' own launcher (``databricks-sdk-air``, 19), Horovod code on
``hvdrunner.hvd_torch``. What cannot exist here - the notebook context and the GPUs - is
stood in for by tests/helpers/serverless_notebook.py, which says how; the MLflow tracking
server the launcher logs its run to is a real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest

from helpers.docblocks import block
from helpers.ports import free_port

pytestmark = [pytest.mark.torch, pytest.mark.stacks("19")]
HELPERS = Path(__file__).parent / "helpers"


@pytest.fixture()
def tracking_server(tmp_path):
    """``mlflow server`` on a sqlite store: where the launcher's ``databricks`` URI leads."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{tmp_path / 'server.db'}", "--default-artifact-root", str(tmp_path / "art"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        # Tracking only: MLflow 3's server job runner keeps its queue in a /dev/shm folder
        # that outlives the server (one per run of this test, found in CI) and starts
        # consumer processes this test has no use for.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "no mlflow server"
            time.sleep(0.5)
    try:
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.timeout(300)
def test_the_serverless_example_trains_in_step_under_databricks_launcher(tmp_path, tracking_server):
    code = tmp_path / "notebook_cell.py"
    code.write_text(block("pytorch.md", "serverless-distributed"))
    result = tmp_path / "losses.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "MLFLOW_"))}
    env.update(
        DATABRICKS_HOST=tracking_server, DATABRICKS_TOKEN="stand-in", HOME=str(tmp_path),
        MLFLOW_EXPERIMENT_NAME="/Users/first.last@example.com/serverless",
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "serverless_notebook.py"), str(code), str(result)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = json.loads(result.read_text())
    # One list per GPU the notebook has, every rank the same averaged loss: in step.
    assert len(losses) == 8 and all(rank == losses[0] for rank in losses)
    assert len(losses[0]) == 30 and losses[0][-1] < losses[0][0] / 100
    # The launcher's own run, in the real tracking server, ended FINISHED.
    client = mlflow.MlflowClient(tracking_server)
    (experiment,) = [e for e in client.search_experiments() if e.name.endswith("/serverless")]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
