# Databricks notebook source
# MAGIC %md
# MAGIC # 01 · Prepare data
# MAGIC Opened by hand: install hvdrunner first (the next cell says how, docs/install.md); 01 → 02 → 03 then run with their defaults, each finding what the previous one wrote.
# MAGIC Loads the training data into a Spark DataFrame, splits it into train and test, writes
# MAGIC both (Delta on Databricks, Parquet locally) and passes their paths on as task values.
# MAGIC
# MAGIC | widget | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `source` | `sklearn:digits` (bundled, no download), a table name, or a path | `sklearn:digits` |
# MAGIC | `output_dir` | where train/test are written (`/Volumes/…`, `dbfs:/…`, a local dir off Databricks) | `/Volumes/<current catalog>/<current schema>/hvdrunner/data` on Databricks, `./.hvdrunner/data` elsewhere |
# MAGIC | `test_fraction` | share of rows held out for testing | `0.2` |
# MAGIC
# MAGIC Task values set: `train_path`, `test_path`.

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

from hvdrunner.notebook import default_dir

dbutils.widgets.text("source", "sklearn:digits", "Source")
dbutils.widgets.text("output_dir", default_dir("data"), "Output directory")
dbutils.widgets.text("test_fraction", "0.2", "Test fraction")

# COMMAND ----------

from hvdrunner.examples import datasets

df = datasets.load_source(spark, dbutils.widgets.get("source"))
paths = datasets.split_and_write(df, dbutils.widgets.get("output_dir"), float(dbutils.widgets.get("test_fraction")))
for key in ("train_path", "test_path"):
    dbutils.jobs.taskValues.set(key, paths[key])
print(f"train: {paths['train_path']}\ntest:  {paths['test_path']}")
