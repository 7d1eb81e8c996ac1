# Databricks notebook source
# MAGIC %md
# MAGIC # 03 · Batch inference
# MAGIC Loads the trained model (Keras or PyTorch) from MLflow, scores the test split with
# MAGIC `mlflow.pyfunc.spark_udf`, writes the predictions, prints the accuracy and logs it to
# MAGIC the training run as `test_accuracy`.
# MAGIC
# MAGIC | widget | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `test_path` | data to score (empty: task value of `prepare_data`) | `` |
# MAGIC | `train_task` | the training task whose model is scored: `train_keras` or `train_torch` | `train_keras` |
# MAGIC | `model_uri` | MLflow model (empty: task value of `train_task`) | `` |
# MAGIC | `run_id` | run to log `test_accuracy` to (empty: task value of `train_task`) | `` |
# MAGIC | `predictions_path` | where predictions are written | `/Volumes/<current catalog>/<current schema>/hvdrunner/predictions` on Databricks, `./.hvdrunner/predictions` elsewhere |

# COMMAND ----------

# hvdrunner and its horovod wheel: the bundle's jobs attach them as task libraries. A
# notebook imported by hand needs them installed first (docs/install.md): a cell above with
#   %pip install /Volumes/<catalog>/<schema>/hvdrunner/wheels/<runtime>/*.whl
# then dbutils.library.restartPython(), or both wheels as cluster libraries.
try:
    import hvdrunner
except ImportError as exc:
    raise ImportError(
        "hvdrunner is not installed on this cluster: install the wheels hvdrunner_build_horovod "
        "published (%pip install /Volumes/<catalog>/<schema>/hvdrunner/wheels/<runtime>/*.whl, "
        "then dbutils.library.restartPython()), or attach them as cluster libraries"
    ) from exc

# COMMAND ----------

from hvdrunner.notebook import default_dir

dbutils.widgets.text("test_path", "", "Test data path")
dbutils.widgets.text("train_task", "train_keras", "Training task")
dbutils.widgets.text("model_uri", "", "Model URI")
dbutils.widgets.text("run_id", "", "MLflow run id")
dbutils.widgets.text("predictions_path", default_dir("predictions"), "Predictions path")

# COMMAND ----------

from hvdrunner import datasets
from hvdrunner.inference import score
from hvdrunner.notebook import upstream

w = dbutils.widgets.get
test_path = upstream(dbutils, "test_path", "prepare_data")
model_uri = upstream(dbutils, "model_uri", w("train_task"))
run_id = upstream(dbutils, "run_id", w("train_task"))
result = score(
    spark, model_uri, datasets.read(spark, test_path), features="pixels", label="label",
    output_path=w("predictions_path"), run_id=run_id,
)  # fmt: skip
print(f"test accuracy: {result['accuracy']:.3f} on {result['rows']} rows (MLflow run {run_id})")
dbutils.jobs.taskValues.set("test_accuracy", result["accuracy"])
