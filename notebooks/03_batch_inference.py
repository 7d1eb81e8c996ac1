# Databricks notebook source
# MAGIC %md
# MAGIC # 03 · Batch inference
# MAGIC Loads the trained model from MLflow, scores the test split with
# MAGIC `mlflow.pyfunc.spark_udf`, writes the predictions, prints the accuracy and logs it to
# MAGIC the training run as `test_accuracy`.
# MAGIC
# MAGIC | widget | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `test_path` | data to score (default: task value of `prepare_data`) | `` |
# MAGIC | `model_uri` | MLflow model (default: task value of `train_keras`) | `` |
# MAGIC | `run_id` | run to log `test_accuracy` to (default: task value of `train_keras`) | `` |
# MAGIC | `predictions_path` | where predictions are written | `.hvdrunner/demo-data/predictions` |

# COMMAND ----------

# MAGIC %pip install -r ../requirements.txt

# COMMAND ----------

dbutils.widgets.text("test_path", "", "Test data path")
dbutils.widgets.text("model_uri", "", "Model URI")
dbutils.widgets.text("run_id", "", "MLflow run id")
dbutils.widgets.text("predictions_path", ".hvdrunner/demo-data/predictions", "Predictions path")

# COMMAND ----------

from hvdrunner import datasets
from hvdrunner.inference import score

w = dbutils.widgets.get
test_path = w("test_path") or dbutils.jobs.taskValues.get("prepare_data", "test_path")
model_uri = w("model_uri") or dbutils.jobs.taskValues.get("train_keras", "model_uri")
run_id = w("run_id") or dbutils.jobs.taskValues.get("train_keras", "run_id")
result = score(
    spark, model_uri, datasets.read(spark, test_path), features="pixels", label="label",
    output_path=w("predictions_path"), run_id=run_id,
)  # fmt: skip
print(f"test accuracy: {result['accuracy']:.3f} on {result['rows']} rows (MLflow run {run_id})")
dbutils.jobs.taskValues.set("test_accuracy", result["accuracy"])
