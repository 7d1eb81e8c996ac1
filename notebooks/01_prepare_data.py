# Databricks notebook source
# MAGIC %md
# MAGIC # 01 · Prepare data
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

dbutils.widgets.text("source", "sklearn:digits", "Source")
dbutils.widgets.text("output_dir", default_dir("data"), "Output directory")
dbutils.widgets.text("test_fraction", "0.2", "Test fraction")

# COMMAND ----------

from hvdrunner import datasets

df = datasets.load_source(spark, dbutils.widgets.get("source"))
paths = datasets.split_and_write(df, dbutils.widgets.get("output_dir"), float(dbutils.widgets.get("test_fraction")))
for key in ("train_path", "test_path"):
    dbutils.jobs.taskValues.set(key, paths[key])
print(f"train: {paths['train_path']}\ntest:  {paths['test_path']}")
