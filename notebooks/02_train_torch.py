# Databricks notebook source
# MAGIC %md
# MAGIC # 02 · Train a PyTorch model on Horovod ranks
# MAGIC Opened by hand: install hvdrunner first (the next cell says how, docs/install.md); 01 → 02 → 03 then run with their defaults, each finding what the previous one wrote.
# MAGIC Feeds the training split to `np` Horovod ranks (Spark barrier tasks, one GPU each on a
# MAGIC GPU cluster) through `hvdrunner.torch.fit`, inside one MLflow run written by rank 0:
# MAGIC params, metrics averaged over ranks, the model (`mlflow.pytorch`). Edit `build_model`
# MAGIC below; everything else is configuration. The same chain as `02_train_keras`:
# MAGIC `03_batch_inference` scores this model when its `train_task` is `train_torch`.
# MAGIC
# MAGIC | widget | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `np` | Horovod ranks (`>0`: Spark tasks, `<0`: driver processes) | `2` |
# MAGIC | `epochs`, `batch_size`, `learning_rate` | training; batch is per rank, LR is scaled by `np` | `10`, `32`, `0.001` |
# MAGIC | `warmup_epochs` | linear LR warmup | `2` |
# MAGIC | `experiment` | MLflow experiment | `/Users/<you>/hvdrunner-digits` on Databricks, `hvdrunner-digits` elsewhere |
# MAGIC | `run_key` | a job's run id (`{{job.run_id}}`): a retry of the task continues the MLflow run and the checkpoints of its first try (empty: a new run) | `` |
# MAGIC | `checkpoint_dir` | rank-0 checkpoints; a retry resumes from them (empty: `checkpoints/<run_key>` beside `cache_dir` with a `run_key`, else none) | `` |
# MAGIC | `features`, `label` | the training table's feature and label columns | `pixels`, `label` |
# MAGIC | `max_restarts` | restarts of a failed job inside this task (a lost node, a killed rank), resuming from the checkpoint | `1` |
# MAGIC | `registered_model_name` | register the model (Unity Catalog: `<catalog>.<schema>.<model>`; empty: log only) | `` |
# MAGIC | `model_alias` | once the job's run has finished without error, this alias of `registered_model_name` points at the version it registered; `model_uri` is then `models:/<name>@<alias>` | `champion` |
# MAGIC | `cache_dir` | where the DataFrame is materialized for the ranks (every node must see it) | `/Volumes/<current catalog>/<current schema>/hvdrunner/cache` on Databricks, `./.hvdrunner/cache` elsewhere |
# MAGIC | `train_path` | training data (empty: task value of `prepare_data`; by hand, what 01 wrote with its defaults) | `` |
# MAGIC
# MAGIC Task values set: `model_uri` (the alias's URI when registered), `run_id`.

# COMMAND ----------

# hvdrunner on this cluster: the bundle's jobs attach it as a task library. Opened by hand,
# install it first in a cell above this one (docs/install.md), then run the notebook:
#   Keras (on TensorFlow or PyTorch), PyTorch - hvdrunner's wheel alone, nothing compiled:
#     %pip install /Volumes/<catalog>/<schema>/hvdrunner/hvdrunner-0.2.0-py3-none-any.whl
#     dbutils.library.restartPython()
#   on a compiled horovod instead (HVDRUNNER_ENGINE=horovod), the wheels hvdrunner_build_horovod
#   publishes once per runtime:
#     %pip install -r /Volumes/<catalog>/<schema>/hvdrunner/wheels/<runtime>/requirements.txt
#     dbutils.library.restartPython()
# then check it in a Python cell: import hvdrunner.doctor; hvdrunner.doctor.check()
try:
    import hvdrunner
except ImportError as exc:
    raise ImportError(
        "hvdrunner is not installed on this cluster: install it in a cell above with the "
        "%pip line this cell's comment gives for your framework (docs/install.md)"
    ) from exc

# COMMAND ----------

import os

from hvdrunner.notebook import default_dir, default_experiment

dbutils.widgets.text("np", "2", "Horovod ranks")
dbutils.widgets.text("epochs", "10", "Epochs")
dbutils.widgets.text("batch_size", "32", "Batch size per rank")
dbutils.widgets.text("learning_rate", "0.001", "Learning rate (before scaling)")
dbutils.widgets.text("warmup_epochs", "2", "Warmup epochs")
dbutils.widgets.text("experiment", default_experiment("hvdrunner-digits"), "MLflow experiment")
dbutils.widgets.text("run_key", "", "Job run id (a retry continues its run)")
dbutils.widgets.text("checkpoint_dir", "", "Checkpoint directory")
dbutils.widgets.text("features", "pixels", "Feature column")
dbutils.widgets.text("label", "label", "Label column")
dbutils.widgets.text("max_restarts", "1", "Restarts of a failed job")
dbutils.widgets.text("registered_model_name", "", "Registered model name")
dbutils.widgets.text("model_alias", "champion", "Alias of the registered version")
dbutils.widgets.text("cache_dir", default_dir("cache"), "Data cache directory")
dbutils.widgets.text("train_path", "", "Training data path")

# COMMAND ----------


def build_model():
    """The model: plain PyTorch, no Horovod. Edit freely (it outputs logits)."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


# COMMAND ----------

from hvdrunner import HorovodRunner, tracking
from hvdrunner.data import prepare
from hvdrunner.examples import datasets
from hvdrunner.notebook import upstream
from hvdrunner.torch import fit

w = dbutils.widgets.get
# By hand (no task values): what 01 wrote with its default output_dir.
train_path = upstream(dbutils, "train_path", "prepare_data", by_hand=lambda: datasets.written(default_dir("data"), "train"))
run_key = w("run_key") or None
# Default: checkpoints/<run_key> beside cache_dir (a job's retry resumes from them).
checkpoint_dir = w("checkpoint_dir") or (f"{os.path.dirname(w('cache_dir').rstrip('/'))}/checkpoints/{run_key}" if run_key else None)
registered = w("registered_model_name") or None
tracking.registry_for(registered, w("model_alias"))  # refused here, before any rank starts
with tracking.mlflow_run(experiment=w("experiment"), run_name=f"torch-np{w('np')}", resume_key=run_key) as run:
    data = prepare(datasets.read(spark, train_path), features=w("features"), label=w("label"), cache_dir=w("cache_dir"))
    result = HorovodRunner(np=int(w("np")), driver_log_verbosity="all", max_restarts=int(w("max_restarts"))).run(
        fit,
        build_model=build_model,
        data=data,
        epochs=int(w("epochs")),
        batch_size=int(w("batch_size")),
        learning_rate=float(w("learning_rate")),
        warmup_epochs=int(w("warmup_epochs")),
        loss="cross_entropy",
        metrics=["accuracy"],
        checkpoint_dir=checkpoint_dir,
        registered_model_name=registered,
    )
# The run has finished without error: only now does the alias move to what it registered.
model_uri = tracking.set_alias(registered, w("model_alias"), run.info.run_id) if registered else result.model_uri
dbutils.jobs.taskValues.set("model_uri", model_uri)
dbutils.jobs.taskValues.set("run_id", run.info.run_id)
# A retry that resumed after the last epoch trains nothing more: its history is empty.
accuracy = result.history.get("accuracy", [float("nan")])[-1]
print(f"MLflow run {run.info.run_id}: final accuracy {accuracy:.3f}, model {model_uri}")
