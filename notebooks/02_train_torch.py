# Databricks notebook source
# MAGIC %md
# MAGIC # 02 · Train a PyTorch model on Horovod ranks
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
# MAGIC | `experiment` | MLflow experiment (a workspace path on Databricks) | `hvdrunner-digits` |
# MAGIC | `checkpoint_dir` | rank-0 checkpoints; a retried job resumes from them (empty: none) | `` |
# MAGIC | `cache_dir` | where the DataFrame is materialized for the ranks (every node must see it) | `/Volumes/main/default/hvdrunner/cache` on Databricks, `./.hvdrunner/cache` elsewhere |
# MAGIC | `train_path` | training data (empty: task value of `prepare_data`; set it when running by hand) | `` |
# MAGIC
# MAGIC Task values set: `model_uri`, `run_id`.

# COMMAND ----------

# MAGIC %pip install -r ../requirements.txt

# COMMAND ----------

# Since DBR 13 a %pip install needs a restart before the new packages import.
dbutils.library.restartPython()

# COMMAND ----------

from hvdrunner.notebook import default_dir

dbutils.widgets.text("np", "2", "Horovod ranks")
dbutils.widgets.text("epochs", "10", "Epochs")
dbutils.widgets.text("batch_size", "32", "Batch size per rank")
dbutils.widgets.text("learning_rate", "0.001", "Learning rate (before scaling)")
dbutils.widgets.text("warmup_epochs", "2", "Warmup epochs")
dbutils.widgets.text("experiment", "hvdrunner-digits", "MLflow experiment")
dbutils.widgets.text("checkpoint_dir", "", "Checkpoint directory")
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

from hvdrunner import HorovodRunner, datasets, tracking
from hvdrunner.data import prepare
from hvdrunner.notebook import upstream
from hvdrunner.torch import fit

w = dbutils.widgets.get
train_path = upstream(dbutils, "train_path", "prepare_data")
with tracking.mlflow_run(experiment=w("experiment"), run_name=f"torch-np{w('np')}") as run:
    data = prepare(datasets.read(spark, train_path), features="pixels", label="label", cache_dir=w("cache_dir"))
    result = HorovodRunner(np=int(w("np")), driver_log_verbosity="all").run(
        fit,
        build_model=build_model,
        data=data,
        epochs=int(w("epochs")),
        batch_size=int(w("batch_size")),
        learning_rate=float(w("learning_rate")),
        warmup_epochs=int(w("warmup_epochs")),
        loss="cross_entropy",
        metrics=["accuracy"],
        checkpoint_dir=w("checkpoint_dir") or None,
    )
dbutils.jobs.taskValues.set("model_uri", result.model_uri)
dbutils.jobs.taskValues.set("run_id", run.info.run_id)
print(f"MLflow run {run.info.run_id}: final accuracy {result.history['accuracy'][-1]:.3f}, model {result.model_uri}")
