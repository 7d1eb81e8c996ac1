"""Mosaic Streaming under HorovodRunner (hvdrunner.streaming): a DataFrame written as MDS
shards, read back value for value; nulls, leftovers and uneven hosts refused; equal steps on
every rank of a real 2-rank job when the rows do not divide; torch.fit training from the
shards; an epoch resumed in the order an uninterrupted run has. On the 18 replica, which
ships mosaicml-streaming 0.13.0 as 18 LTS ML does."""

from __future__ import annotations

import functools
import importlib.metadata as md
import json
import os
import time

import numpy as np
import pytest
from packaging.version import Version

from helpers import digits as digit_data
from helpers.docblocks import block, run_as_notebook
from hvdrunner import HorovodRunner
from hvdrunner._launch.assignments import assign
from hvdrunner.streaming import write_mds
from hvdrunner.streaming.world import problem

# Each runtime's own Streaming: 15.4 ships 0.7.4, 18 0.13.0 (16.4 and 17.3: the smoke tests).
pytestmark = [pytest.mark.torch, pytest.mark.streaming, pytest.mark.stacks("15.4", "18")]
#: The runtime smoke tests of Streaming (a DataFrame to shards; equal steps under
#: HorovodRunner): every replica that ships it.
EVERY_STREAMING = pytest.mark.stacks("15.4", "16.4", "17.3", "18")


def _kinds_frame(spark):
    """Every kind of column write_mds takes, with values a wrong encoding would change."""
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("id", T.LongType()), T.StructField("b", T.ByteType()),
        T.StructField("s", T.ShortType()), T.StructField("i", T.IntegerType()),
        T.StructField("d", T.DoubleType()), T.StructField("flag", T.BooleanType()),
        T.StructField("text", T.StringType()), T.StructField("blob", T.BinaryType()),
        T.StructField("vec", T.ArrayType(T.DoubleType())),
        T.StructField("ints", T.ArrayType(T.IntegerType())),
    ])  # fmt: skip
    rows = [(k, -1 - k % 100, -30000 + k, 2**31 - 1 - k, k / 3, k % 2 == 0, f"row {k} ü",
             bytes([k % 256, 255, 0]), [k * 0.5, -k * 1.0], [k, -k, 7])
            for k in range(37)]  # fmt: skip
    return spark.createDataFrame(rows, schema).repartition(3)


def _read_all(path: str) -> list[dict]:
    """Every sample of the shards, in order, by Streaming itself (world of one)."""
    from streaming import StreamingDataset

    ds = StreamingDataset(local=path, shuffle=False, batch_size=1)
    return [ds[k] for k in range(ds.num_samples)]


@EVERY_STREAMING
def test_every_kind_of_column_reads_back_as_written(spark, tmp_path):
    path = str(tmp_path / "kinds")
    data = write_mds(_kinds_frame(spark), path, dtype=None)
    assert data.num_rows == 37 and dict(data.columns)["b"] == "int8"
    samples = sorted(_read_all(path), key=lambda s: int(s["id"]))
    assert [int(s["id"]) for s in samples] == list(range(37))
    for k, s in enumerate(samples):
        # Signed bytes and shorts keep their sign (Streaming's own converter writes them
        # unsigned: -1 would come back as 255).
        assert (int(s["b"]), int(s["s"]), int(s["i"])) == (-1 - k % 100, -30000 + k, 2**31 - 1 - k)
        assert float(s["d"]) == k / 3 and int(s["flag"]) == (k % 2 == 0)
        assert s["text"] == f"row {k} ü" and s["blob"] == bytes([k % 256, 255, 0])
        assert s["vec"].dtype == np.float64 and s["vec"].tolist() == [k * 0.5, -k * 1.0]
        assert s["ints"].dtype == np.int32 and s["ints"].tolist() == [k, -k, 7]
    # dtype="float32" (the default, as prepare's): floating columns as models take them.
    small = write_mds(_kinds_frame(spark), str(tmp_path / "f32"), columns=["d", "vec"])
    assert dict(small.columns) == {"d": "float32", "vec": "ndarray:float32"}
    assert _read_all(small.path)[0]["vec"].dtype == np.float32


def test_nulls_are_refused_before_anything_is_written(spark, tmp_path):
    rows = [([1.0, None], 1), ([2.0, 3.0], None), ([4.0, 5.0], 3), (None, 4)]
    df = spark.createDataFrame(rows, "x array<double>, y long")
    path = tmp_path / "nulls"
    with pytest.raises(ValueError, match=r"'x' \(2 rows\), 'y' \(1 rows\).*dropna"):
        write_mds(df, str(path), features="x", label="y")
    assert os.listdir(path) == [] and [p.name for p in tmp_path.iterdir()] == ["nulls"]


def test_a_type_mds_cannot_hold_is_named_with_the_fix(spark, tmp_path):
    df = spark.createDataFrame([([[1.0]],)], "nested array<array<double>>")
    with pytest.raises(ValueError, match=r"column 'nested' is array<array<double>>.*F.flatten"):
        write_mds(df, str(tmp_path / "nested"))


def test_existing_shards_are_kept_unless_overwrite_and_replaced_whole(spark, tmp_path):
    path = str(tmp_path / "twice")
    write_mds(spark.range(10).toDF("id"), path)
    with pytest.raises(ValueError, match="already holds MDS shards: pass overwrite=True"):
        write_mds(spark.range(20).toDF("id"), path)
    assert write_mds(spark.range(20).toDF("id"), path, overwrite=True).num_rows == 20
    assert sorted(int(s["id"]) for s in _read_all(path)) == list(range(20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["twice"]  # no old or temporary copy


def test_a_write_that_fails_in_a_task_leaves_nothing(spark, tmp_path):
    from pyspark.sql import functions as F

    @F.udf("double")
    def breaks_on_7(v):
        if v == 7:
            raise ValueError("row 7 is broken")
        return float(v)

    df = spark.range(20).select(breaks_on_7("id").alias("x"))
    path = tmp_path / "failed"
    with pytest.raises(Exception, match="row 7 is broken"):
        write_mds(df, str(path))
    assert os.listdir(path) == [] and [p.name for p in tmp_path.iterdir()] == ["failed"]


def test_uneven_hosts_are_refused_on_at_least_one_rank_and_even_ones_pass():
    def refusals(hosts):
        return [problem(s.rank, s.size, s.local_rank, s.local_size, s.cross_size)
                for s in assign(hosts)]  # fmt: skip

    assert refusals([("a", 2), ("b", 2)]) == [None] * 4
    assert refusals([("a", 1), ("b", 1), ("c", 1)]) == [None] * 3
    for uneven in ([("a", 2), ("b", 1)], [("a", 3), ("b", 1), ("c", 2)], [("a", 1), ("b", 2)]):
        found = [p for p in refusals(uneven) if p]
        assert found and "same number of ranks on every host" in found[0], uneven


def _epochs(data, batch_size, epochs):
    """Each epoch's batches on this rank: the ids in each (run inside the job)."""
    feed = data.batches(batch_size, seed=3)
    steps = data.steps_per_epoch(batch_size)
    return [[next(feed)["id"].tolist() for _ in range(steps)] for _ in range(epochs)]


def _two_epochs(data, batch_size):
    """Two epochs' batches on this rank, and how its decoding workers ended once the feed was
    dropped (as a training loop drops it): 0 each, not killed after the DataLoader's timeout."""
    import multiprocessing

    from hvdrunner import hvd_torch as hvd

    hvd.init()
    feed = data.batches(batch_size, seed=3)
    steps = data.steps_per_epoch(batch_size)
    mine = [[next(feed)["id"].tolist() for _ in range(steps)] for _ in range(2)]
    workers = multiprocessing.active_children()
    del feed
    return hvd.allgather_object((mine, [w.exitcode for w in workers]))


# What differs by Streaming version runs on both replicas; the launcher's other mode, the
# image recipe and the restart (the same Streaming calls as above) on 18 only: CI's time.
ON_18 = pytest.mark.stacks("18")


@pytest.mark.parametrize("np_", [pytest.param(2, marks=EVERY_STREAMING),
                                 pytest.param(-2, marks=ON_18)],
                         ids=["spark-tasks", "driver-processes"])  # fmt: skip
def test_rows_that_do_not_divide_give_every_rank_equal_steps_and_every_row(spark, tmp_path, np_):
    data = write_mds(spark.range(101).toDF("id").repartition(5), str(tmp_path / "odd"))
    assert data.steps_per_epoch(8, num_ranks=2) == 7  # 51 samples a rank
    got = HorovodRunner(np=np_).run(_two_epochs, data=data, batch_size=8)
    # Dropped, the feed stopped its 2 workers there and then (a rank's DataLoader sits in a
    # reference cycle: left to the collector, each waited out a 5 s timeout and was killed).
    assert [exits for _, exits in got] == [[0, 0], [0, 0]]
    ranks = [batches for batches, _ in got]
    for epoch in range(2):
        per_rank = [ranks[r][epoch] for r in range(2)]
        assert [len(b) for b in per_rank] == [7, 7] and [len(b[-1]) for b in per_rank] == [3, 3]
        ids = [i for batches in per_rank for batch in batches for i in batch]
        assert len(ids) == 102 and set(ids) == set(range(101))  # one row read twice
    assert ranks[0][0] != ranks[0][1]  # reshuffled each epoch


def _resumed_mid_epoch(data, batch_size):
    """Three epochs whole, then a feed resumed at epoch 1's step 3 (as from an elastic
    state's committed epoch and batch) read to the end of epoch 2: both, per rank."""
    from hvdrunner import hvd_torch as hvd

    hvd.init()
    whole = _epochs(data, batch_size, 3)
    feed = data.batches(batch_size, seed=3, first_epoch=1, first_step=3)
    steps = data.steps_per_epoch(batch_size)
    resumed = [next(feed)["id"].tolist() for _ in range(steps - 3 + steps)]
    return hvd.allgather_object((whole, resumed))


def test_a_feed_resumed_mid_epoch_reads_the_rest_of_that_epoch_on_every_rank(spark, tmp_path):
    data = write_mds(spark.range(90).toDF("id"), str(tmp_path / "mid"))
    for whole, resumed in HorovodRunner(np=-2).run(_resumed_mid_epoch, data=data, batch_size=8):
        assert len(whole[1]) == 6 and resumed[:3] == whole[1][3:]  # 45 samples a rank
        assert resumed[3:] == whole[2] != whole[1]  # then epoch 2, as it was
    with pytest.raises(ValueError, match=r"first_step=12 must be an int in \[0, 12\)"):
        next(data.batches(8, first_step=12))  # 90 samples, one rank here


def _two_datasets_alive(data, horovod):
    """A second dataset over the same shards while the first is still held."""
    import importlib

    hvd = importlib.import_module(horovod)  # the engine, or the compiled horovod.tensorflow
    hvd.init()
    first = data.dataset(8)
    try:
        second = data.dataset(8)
    except RuntimeError as exc:
        return str(exc)
    ids = [int(s["id"]) for s in second]  # read in this process: no DataLoader workers
    del first
    return hvd.allgather_object(sorted(ids))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("horovod", ["hvdrunner.hvd_torch", pytest.param(
    "horovod.tensorflow", marks=pytest.mark.keras)])  # fmt: skip
def test_a_second_dataset_over_the_same_shards_reads_or_is_refused_never_hangs(
    spark, tmp_path, horovod
):  # fmt: skip
    # Streaming before 0.11 gives the ranks of a host different shared memory when an earlier
    # dataset over the folder is alive (its loaders then waited for each other forever on the
    # 15.4 replica); hvdrunner refuses that. Later versions read the second one as they should.
    # Under the compiled horovod.tensorflow no torch group existed to compare the ranks
    # through (the second dataset's read hung): hvdrunner starts one there.
    data = write_mds(spark.range(40).toDF("id"), str(tmp_path / "twice"))
    got = HorovodRunner(np=-2).run(_two_datasets_alive, data=data, horovod=horovod)
    if Version(md.version("mosaicml-streaming")) < Version("0.11"):
        assert "another StreamingDataset over the same folder is alive" in got, got
    else:
        assert sorted(got[0] + got[1]) == list(range(40))


def test_a_resumed_epoch_is_the_epoch_an_uninterrupted_run_reads(spark, tmp_path):
    data = write_mds(spark.range(40).toDF("id"), str(tmp_path / "resume"))
    whole = _epochs(data, 8, 3)
    feed = data.batches(8, seed=3, first_epoch=2)
    assert [next(feed)["id"].tolist() for _ in range(5)] == whole[2]
    assert whole[0] != whole[2]


def _fit(**kwargs):
    from hvdrunner.torch import fit

    return fit(**kwargs)


def test_torch_fit_trains_from_mds_shards_as_the_docs_show(spark, tmp_path):
    x_tr, _, y_tr, _ = digit_data.split()
    df_train = spark.createDataFrame(digit_data.frame(x_tr, y_tr))
    mds_dir = str(tmp_path / "digits-mds")
    scope = run_as_notebook(block("streaming.md", "torch-fit"), "streaming.md", spark=spark,
                            df_train=df_train, mds_dir=mds_dir)  # fmt: skip
    data, result = scope["data"], scope["result"]
    assert result.num_ranks == 2 and len(result.history["loss"]) == 6
    assert result.steps_per_epoch == data.steps_per_epoch(32, num_ranks=2) == 23
    assert result.history["accuracy"][-1] > 0.9
    with open(os.path.join(mds_dir, "index.json")) as f:
        assert sum(s["samples"] for s in json.load(f)["shards"]) == len(y_tr)


def _keras_fit(**kwargs):
    from hvdrunner.keras import fit

    return fit(**kwargs)


def _build_keras():
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])  # fmt: skip


@pytest.mark.keras
def test_keras_fit_on_tensorflow_trains_from_mds_shards(spark, tmp_path):
    x_tr, _, y_tr, _ = digit_data.split()
    df = spark.createDataFrame(digit_data.frame(x_tr, y_tr))
    data = write_mds(df, str(tmp_path / "digits"), features="pixels", label="label")
    result = HorovodRunner(np=2).run(_keras_fit, build_model=_build_keras, data=data, epochs=4,
                                     batch_size=32, log_model=False, verbose=0,
                                     loss="sparse_categorical_crossentropy",
                                     metrics=["accuracy"])  # fmt: skip
    assert result.steps_per_epoch == data.steps_per_epoch(32, num_ranks=2)
    assert result.history["accuracy"][-1] > 0.85


def _workers_parents(data, with_tensorflow):
    """The parent process of each DataLoader worker that decoded a batch, and this rank's pid."""
    from multiprocessing import util

    import numpy as np

    from hvdrunner import hvd_torch as hvd
    from hvdrunner.data.transform import TransformSpec

    if with_tensorflow:
        import tensorflow  # noqa: F401 - loaded, as in a Keras job on TensorFlow

    hvd.init()
    # Defined here: a worker the forkserver starts gets it by value (no module holds it).
    parent = TransformSpec(lambda df: df.assign(parent=os.getppid()),
                           edit_fields=[("parent", np.int64, (), False)])  # fmt: skip
    feed = data.transformed(parent, "id", "parent").batches(4)
    parents = {int(p) for _ in range(data.steps_per_epoch(4)) for p in next(feed)["parent"]}
    feed.close()
    temp = util.get_temp_dir() if with_tensorflow else None  # made for the forkserver
    return hvd.allgather_object((os.getpid(), sorted(parents), temp))


@pytest.mark.keras
@pytest.mark.parametrize("with_tensorflow", [True, False], ids=["tensorflow", "torch-only"])
def test_loader_workers_start_from_the_forkserver_where_tensorflow_is_loaded(
    spark, tmp_path, with_tensorflow
):  # fmt: skip
    """A process forked while TensorFlow's threads run can stop inside os.fork() for good: a
    15.4 CI run of Keras fit from MDS shards hung when one rank's worker never started and the
    others waited for it in Streaming's barrier (about 1 job in 25 under load, reproduced).
    Where TensorFlow is loaded the workers come from the forkserver; elsewhere they are forked
    from the rank (faster)."""
    data = write_mds(spark.range(40).toDF("id"), str(tmp_path / "parents"))
    for pid, parents, temp in HorovodRunner(np=2).run(_workers_parents, data=data,
                                                      with_tensorflow=with_tensorflow):  # fmt: skip
        assert len(parents) == 1, parents  # both workers of a rank from one parent
        assert (parents[0] != pid) is with_tensorflow, (pid, parents)
        # multiprocessing's folder (the forkserver's socket): gone with the rank.
        assert temp is None or not os.path.exists(temp), os.listdir(temp)


def test_the_python_thread_feed_passes_items_and_the_error_through_and_stops_when_left():
    from hvdrunner.streaming.handle import in_python_thread

    def broken():
        yield from range(3)
        raise OSError("shard 7 unreadable")

    got = []
    with pytest.raises(OSError, match="shard 7 unreadable"):
        for item in in_python_thread(broken):
            got.append(item)
    assert got == [0, 1, 2]
    closed = []

    def endless():
        try:
            yield from iter(int, 1)
        finally:
            closed.append(True)

    feed = in_python_thread(endless)
    assert [next(feed) for _ in range(5)] == [0] * 5
    feed.close()  # the consumer leaves: the producer has stopped and closed its iterator
    assert closed == [True]  # already: a dataset made next finds this one's released

    def slow():  # a producer between two items when the consumer leaves
        try:
            while True:
                yield 1
                time.sleep(0.5)
        finally:
            closed.append("slow")

    feed = in_python_thread(slow)
    assert next(feed) == 1
    feed.close()
    assert closed == [True, "slow"]


@ON_18
def test_the_image_recipe_trains_from_mds_shards_decoded_in_the_loader_workers(spark, tmp_path):
    """Databricks' flowers recipe with Streaming as the feed: JPEG bytes written as MDS
    shards, decoded by the recipe's TransformSpec in each rank's DataLoader workers; rank 1
    killed in epoch 3, and the job (max_restarts=1) resumes there and still learns."""
    import hvdrunner.torch
    from hvdrunner.examples.images import decode_spec
    from test_image_recipes import flat_model, flowers
    from test_torch_fit import KillRank1InEpoch3

    train, _ = flowers(spark, tmp_path / "flowers")
    shards = write_mds(train, str(tmp_path / "flowers-mds"), columns=["content", "label_index"])
    assert dict(shards.columns) == {"content": "bytes", "label_index": "float32"}
    data = shards.transformed(decode_spec(32), "features", "label_index")
    flag = str(tmp_path / "killed")
    build = functools.partial(KillRank1InEpoch3, flag, data.steps_per_epoch(16, num_ranks=2),
                              flat_model)  # fmt: skip
    before = _streaming_shm()
    result = HorovodRunner(np=2, max_restarts=1).run(
        hvdrunner.torch.fit, build_model=build, data=data, epochs=4, batch_size=16,
        learning_rate=0.003, loss="cross_entropy", metrics=["accuracy"], log_model=False,
        checkpoint_dir=str(tmp_path / "ckpt"),
    )  # fmt: skip
    assert os.path.exists(flag) and result.initial_epoch == 2  # killed, resumed at epoch 3
    assert result.history["accuracy"][-1] > 0.9
    assert _streaming_shm() <= before


def _streaming_shm() -> set[str]:
    import glob

    return set(glob.glob("/dev/shm/[0-9][0-9][0-9][0-9][0-9][0-9]_*"))


@ON_18
def test_a_killed_rank_restarts_at_its_epoch_and_ends_as_an_undisturbed_run(spark, tmp_path):
    """rank 1 SIGKILLed in epoch 3 (after epoch 2's checkpoint); with max_restarts=1 the job
    resumes at epoch 3 and ends with the weights of a run that was never killed: Streaming
    reads epoch 3 in the order the first attempt would have. No shared memory is left."""
    import torch

    from test_torch_fit import KillRank1InEpoch3

    before = _streaming_shm()
    x_tr, _, y_tr, _ = digit_data.split()
    data = write_mds(spark.createDataFrame(digit_data.frame(x_tr, y_tr)),
                     str(tmp_path / "digits"), features="pixels", label="label")  # fmt: skip
    steps = data.steps_per_epoch(32, num_ranks=2)
    runs = {}
    open(tmp_path / "flag-set", "w").close()
    for name, flag in (("undisturbed", "flag-set"), ("killed", "flag-kill")):
        build = functools.partial(KillRank1InEpoch3, str(tmp_path / flag), steps)
        ckpt = str(tmp_path / f"ckpt-{name}")
        result = HorovodRunner(np=2, max_restarts=1).run(
            _fit, build_model=build, data=data, epochs=4, batch_size=32, loss="cross_entropy",
            checkpoint_dir=ckpt, log_model=False, verbose=0,
        )  # fmt: skip
        runs[name] = (result, torch.load(os.path.join(ckpt, "epoch-00004", "model.pt")))
    assert os.path.exists(tmp_path / "flag-kill")  # the fault happened
    assert runs["killed"][0].initial_epoch == 2 and runs["undisturbed"][0].initial_epoch == 0
    for key, want in runs["undisturbed"][1].items():
        torch.testing.assert_close(runs["killed"][1][key], want, rtol=0, atol=1e-6)
    assert _streaming_shm() <= before  # the killed rank's too
