# Databricks notebook source
# MAGIC %md
# MAGIC # 04 · Images: JPEG files to a table, decoded on the ranks, a model, scored images
# MAGIC Opened by hand: install hvdrunner first (the next cell says how, docs/install.md).
# MAGIC Databricks' image recipe end to end: image files (`<class>/<image>.jpg`) read with
# MAGIC Spark's `binaryFile` source into a table (Delta on Databricks, Parquet here) of JPEG
# MAGIC bytes and an indexed label; `prepare()` caches the bytes as they are (or, with
# MAGIC `feed=streaming`, Mosaic Streaming's MDS shards hold them); each rank decodes
# MAGIC its own batches (`hvdrunner.examples.images.decode_spec`, a petastorm `TransformSpec`) while
# MAGIC `hvdrunner.keras.fit` trains a small CNN on `np` ranks and logs it to MLflow; the model
# MAGIC then scores the held-out images on the executors. With no `images_dir`, it writes a
# MAGIC synthetic flowers set (5 classes) first. Edit `build_model`; the rest is configuration.
# MAGIC
# MAGIC | widget | meaning | default |
# MAGIC |---|---|---|
# MAGIC | `images_dir` | a folder of `<class>/<image>` files (empty: synthetic flowers under `flowers`) | `` |
# MAGIC | `table_path` | where the image table is written | `/Volumes/<current catalog>/<current schema>/hvdrunner/images` on Databricks, `./.hvdrunner/images` elsewhere |
# MAGIC | `cache_dir` | where `prepare()` caches the JPEG bytes for the ranks (every node must see it) | `…/hvdrunner/cache` |
# MAGIC | `feed` | `prepare`: `hvdrunner.data.prepare`; `streaming`: Mosaic Streaming's MDS shards (`hvdrunner.streaming.write_mds`, in `cache_dir/images-mds`; docs/streaming.md) | `prepare` |
# MAGIC | `np` | Horovod ranks | `2` |
# MAGIC | `epochs`, `batch_size`, `learning_rate` | training; batch is per rank, LR is scaled by `np` | `6`, `16`, `0.002` |
# MAGIC | `image_size` | images are decoded and resized to this square size | `32` |
# MAGIC | `experiment` | MLflow experiment | `/Users/<you>/hvdrunner-images` on Databricks, `hvdrunner-images` elsewhere |
# MAGIC | `registered_model_name` | register the model (Unity Catalog: `<catalog>.<schema>.<model>`; empty: log only) | `` |
# MAGIC
# MAGIC Task values set: `model_uri`, `run_id`, `test_accuracy`.

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

dbutils.widgets.text("images_dir", "", "Image folder")
dbutils.widgets.text("table_path", default_dir("images"), "Image table")
dbutils.widgets.text("cache_dir", default_dir("cache"), "Data cache directory")
dbutils.widgets.dropdown("feed", "prepare", ["prepare", "streaming"], "Input feed")
dbutils.widgets.text("np", "2", "Horovod ranks")
dbutils.widgets.text("epochs", "6", "Epochs")
dbutils.widgets.text("batch_size", "16", "Batch size per rank")
dbutils.widgets.text("learning_rate", "0.002", "Learning rate (before scaling)")
dbutils.widgets.text("image_size", "32", "Image size")
dbutils.widgets.text("experiment", default_experiment("hvdrunner-images"), "MLflow experiment")
dbutils.widgets.text("registered_model_name", "", "Registered model name")

# COMMAND ----------


def build_model(size=int(dbutils.widgets.get("image_size")), classes=5):
    """The model: plain Keras, no Horovod. Edit freely."""
    import tensorflow as tf

    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(size, size, 3)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(classes, activation="softmax"),
        ]
    )


# COMMAND ----------

import functools

from hvdrunner import HorovodRunner, tracking
from hvdrunner.data import prepare
from hvdrunner.examples import datasets
from hvdrunner.examples.images import decode, decode_spec, read_image_table
from hvdrunner.inference import score_images
from hvdrunner.keras import fit
from hvdrunner.streaming import write_mds

w = dbutils.widgets.get
size = int(w("image_size"))
images_dir = w("images_dir") or datasets.write_synthetic_flowers(default_dir("flowers"), size=size)
table = datasets.read(spark, datasets.write(read_image_table(spark, images_dir), w("table_path")))
train_df, test_df = table.randomSplit([0.8, 0.2], seed=0)
if w("feed") == "streaming":  # Mosaic Streaming, Databricks' data path after petastorm
    data = write_mds(train_df, w("cache_dir").rstrip("/") + "/images-mds",
                     columns=["content", "label_index"], overwrite=True)
else:
    data = prepare(train_df, features=["content", "label_index"], cache_dir=w("cache_dir"))
with tracking.mlflow_run(experiment=w("experiment"), run_name=f"images-np{w('np')}") as run:
    result = HorovodRunner(np=int(w("np")), driver_log_verbosity="all").run(
        fit,
        build_model=build_model,
        data=data.transformed(decode_spec(size), "features", "label_index"),
        epochs=int(w("epochs")),
        batch_size=int(w("batch_size")),
        learning_rate=float(w("learning_rate")),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        registered_model_name=w("registered_model_name") or None,
    )
scores = score_images(result.model_uri, test_df, functools.partial(decode, size=size), run_id=run.info.run_id)
test_accuracy = scores.accuracy
dbutils.jobs.taskValues.set("model_uri", result.model_uri)
dbutils.jobs.taskValues.set("run_id", run.info.run_id)
dbutils.jobs.taskValues.set("test_accuracy", test_accuracy)
print(f"MLflow run {run.info.run_id}: model {result.model_uri}, test accuracy {test_accuracy:.3f}")
