# Databricks notebook source
# MAGIC %md
# MAGIC # 03 · Batch inference
# MAGIC Opened by hand: install hvdrunner first (the next cell says how, docs/install.md); 01 → 02 → 03 then run with their defaults, each finding what the previous one wrote.
# MAGIC Loads the trained model (Keras or PyTorch) from MLflow, scores the test split with
# MAGIC `mlflow.pyfunc.spark_udf`, writes the predictions, prints the accuracy and logs it to
# MAGIC the training run as `test_accuracy`.
# MAGIC
# MAGIC | widget | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `test_path` | data to score (empty: task value of `prepare_data`; by hand, what 01 wrote with its defaults) | `` |
# MAGIC | `train_task` | the training task whose model is scored: `train_keras` or `train_torch` | `train_keras` |
# MAGIC | `model_uri` | MLflow model, e.g. `models:/<catalog>.<schema>.<model>@champion` (empty: task value of `train_task`; by hand, the newest model in `experiment`); an alias is resolved once to its version, and that version is scored | `` |
# MAGIC | `run_id` | run to log `test_accuracy` to: the run that logged the model, else scoring stops (empty: task value of `train_task`; by hand, that model's run) | `` |
# MAGIC | `experiment` | where a notebook run by hand finds the newest model | `/Users/<you>/hvdrunner-digits` on Databricks, `hvdrunner-digits` elsewhere |
# MAGIC | `predictions_path` | where predictions are written | `/Volumes/<current catalog>/<current schema>/hvdrunner/predictions` on Databricks, `./.hvdrunner/predictions` elsewhere |

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

from hvdrunner.notebook import default_dir, default_experiment

dbutils.widgets.text("test_path", "", "Test data path")
dbutils.widgets.text("train_task", "train_keras", "Training task")
dbutils.widgets.text("model_uri", "", "Model URI")
dbutils.widgets.text("run_id", "", "MLflow run id")
dbutils.widgets.text("experiment", default_experiment("hvdrunner-digits"), "MLflow experiment (by hand)")
dbutils.widgets.text("predictions_path", default_dir("predictions"), "Predictions path")

# COMMAND ----------

from hvdrunner.examples import datasets
from hvdrunner.inference import score
from hvdrunner.notebook import upstream
from hvdrunner.tracking import pin
from hvdrunner.tracking.models import latest_model

w = dbutils.widgets.get
# By hand (no task values): what 01 wrote with its defaults, and the newest model in `experiment`.
test_path = upstream(dbutils, "test_path", "prepare_data", by_hand=lambda: datasets.written(default_dir("data"), "test"))
model_uri = upstream(dbutils, "model_uri", w("train_task"), by_hand=lambda: (latest_model(w("experiment")) or (None,))[0])
run_id = upstream(dbutils, "run_id", w("train_task"), by_hand=lambda: pin(model_uri)[1])
result = score(
    spark, model_uri, datasets.read(spark, test_path), features="pixels", label="label",
    output_path=w("predictions_path"), run_id=run_id,
)  # fmt: skip
print(f"test accuracy: {result.accuracy:.3f} on {result.rows} rows (MLflow run {run_id})")
dbutils.jobs.taskValues.set("test_accuracy", result.accuracy)
