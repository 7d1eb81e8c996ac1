"""Real work on a two-host cluster (tests/helpers/netns_cluster.py), one driver process.

    python tests/helpers/multihost_job.py MODE [SCENARIO ...]

MODE is ``resolving`` or ``loopback`` (each host's name resolves to loopback). Runs each
scenario on 2 hosts x 2 ranks and prints one ``RESULT <scenario> <json>`` line per scenario
(an exception becomes ``{"error": ...}``, so one failure does not hide the others):

- ``collectives``: allreduce, broadcast, a 4 MB allreduce, allgather_object; who is where.
- ``recipe``: the standard Horovod Keras recipe through ``hvdrunner.hvd_keras``.
- ``unpatched``: a rank on a loopback-named host with horovod taken as unpatched.
- ``hidden_cache``: prepared data that one host cannot see (its view of the dir is empty),
  met by ``hvdrunner.torch.fit`` (the data layer's check comes before any framework's work).
- ``host_lost``: a whole host killed mid-training (``hvdrunner.torch.fit``), then the same
  job on the healed cluster.
- ``link_cut``: the same with the host's link cut (``ip link set ... down``) and restored.
- ``torch_recipe``, ``torch_fit``, ``torch_restarts``, ``torch_min_np``,
  ``torch_concurrent`` (torch stack, which has no compiled horovod; not in the default
  list): the standard Horovod PyTorch recipe on 4 ranks with ``import hvdrunner.hvd_torch
  as hvd`` (the engine, which ``hvdrunner.torch.fit`` below runs on too);
  ``hvdrunner.torch.fit`` on 4 ranks (batch b) against 1 rank (batch 4b); fit with
  ``max_restarts=2`` through a SIGKILLed rank and a killed host; fit going on with the 2
  ranks left after a host is lost for good (``min_np=2``); two jobs of 2 ranks at once, one
  restarting (tests/helpers/faults_on_cluster.py).

Exits 3 (skip) where network namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns_cluster import NetnsCluster, unavailable  # noqa: E402

SCENARIOS = (
    "collectives",
    "recipe",
    "unpatched",
    "hidden_cache",
    "host_lost",
    "link_cut",
    "streaming",
)
#: host_timeout of the lost-host jobs (the default is 30 s): a cut link closes nothing, so
#: silence for this long is how its loss is detected.
HOST_TIMEOUT_S = 8.0
#: Epochs of the lost-host jobs: the strike comes after epoch 2, and the 1 s each later epoch
#: waits keeps the first attempt running for seconds after it.
LOST_HOST_EPOCHS = 6


# -- functions that run in the ranks -------------------------------------------------------
def where_am_i() -> dict[str, Any]:
    import socket

    keys = ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
            "HOROVOD_CROSS_SIZE", "HOROVOD_GLOO_IFACE")  # fmt: skip
    out: dict[str, Any] = {k: os.environ.get(k) for k in keys}
    out["hostname"] = socket.gethostname()
    out["netns"] = os.readlink("/proc/self/ns/net")
    return out


def collectives() -> dict[str, Any]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = hvd.allreduce(tf.constant(float(hvd.rank())), op=hvd.Sum).numpy()
    root = hvd.broadcast(tf.constant([10.0 + hvd.rank()] * 3), root_rank=0).numpy()
    big = hvd.allreduce(tf.fill([1_000_000], float(hvd.rank() + 1)), op=hvd.Average).numpy()
    return {
        "sum": float(total),
        "broadcast": root.tolist(),
        "big_mean": [float(big.min()), float(big.max())],
        "ranks": hvd.allgather_object(where_am_i()),
    }


def keras_recipe() -> dict[str, Any]:
    """The standard Horovod Keras recipe, import changed to hvdrunner.hvd_keras."""
    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    import hvdrunner.hvd_keras as hvd

    hvd.init()
    rng = np.random.default_rng(100 + hvd.rank())  # each rank its own data
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5]) + hvd.rank()).astype("float32")
    tf.keras.utils.set_random_seed(1 + hvd.rank())  # different init: the broadcast must fix it
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    initial = hvd_tf.broadcast_object([w.tolist() for w in model.get_weights()], 0)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])  # fmt: skip
    return {"weights": hvd_tf.allgather_object([w.tolist() for w in model.get_weights()]),
            "initial": initial}  # fmt: skip


def torch_recipe(engine: str = "hvdrunner.hvd_torch") -> dict[str, Any]:
    """The standard Horovod PyTorch recipe, unchanged but for ``import <engine> as hvd``:
    each rank its own data and init."""
    import importlib

    import torch

    hvd = importlib.import_module(engine)

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(100 + hvd.rank())  # different init: the broadcast must fix it
    rng = np.random.default_rng(100 + hvd.rank())
    x = torch.tensor(rng.normal(size=(256, 4)).astype("float32"))
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + hvd.rank()
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                   named_parameters=model.named_parameters())  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    initial = [p.detach().numpy().tolist() for p in model.parameters()]
    for _ in range(2):
        for i in range(0, 256, 32):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[i : i + 32]).reshape(-1), y[i : i + 32]).backward()
            opt.step()
    final = [p.detach().numpy().tolist() for p in model.parameters()]
    return {"weights": hvd.allgather_object(final), "initial": initial,
            "hosts": hvd.allgather_object(where_am_i()["hostname"])}  # fmt: skip


def build_torch_linear() -> Any:
    import torch

    return torch.nn.Linear(4, 1)


def torch_weights(ckpt: str, epochs: int) -> list[Any]:
    import torch

    state = torch.load(os.path.join(ckpt, f"epoch-{epochs:05d}", "model.pt"))
    return [state["weight"].numpy().tolist(), state["bias"].numpy().tolist()]


def unpatched_rank() -> str:
    return "ran"  # where hostnames resolve; elsewhere the task refuses the host first


def build_torch_mlp() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def fit_slowly_after_epoch2(marker: str, **kwargs: Any) -> Any:
    """``hvdrunner.torch.fit`` whose epochs take a while once epoch 2's checkpoint is on
    disk; rank 0 then writes ``marker`` (the hosts of every rank) so the driver knows when to
    strike. A lost host is the launcher's to see, whatever trains: torch imports in 1.7
    CPU-s a rank, TensorFlow with its Keras in 6.7."""
    import hvdrunner.hvd_torch as hvd
    from hvdrunner.torch import fit, loop

    epoch_end = loop.Trainer._epoch_end

    def slow_epoch_end(self: Any, epoch: int, logs: Any, seconds: float) -> None:
        epoch_end(self, epoch, logs, seconds)
        if epoch == 1:  # after rank 0 wrote epoch 2's checkpoint
            hosts = hvd.allgather_object(where_am_i()["hostname"])
            if hvd.rank() == 0:
                Path(marker).write_text(json.dumps(hosts))
        if epoch >= 1:
            time.sleep(1.0)

    loop.Trainer._epoch_end = slow_epoch_end  # type: ignore[method-assign]  # this rank only
    return fit(**kwargs)


# -- scenarios (driver side) ---------------------------------------------------------------
def streaming_epochs(data: Any) -> Any:
    """Two epochs of Mosaic Streaming shards on this rank: its place, steps, ids and the
    Streaming shared memory its host holds."""
    import glob

    import hvdrunner.hvd_torch as hvd

    hvd.init()
    feed, steps = data.batches(8, seed=1), data.steps_per_epoch(8)
    ids = [[int(i) for _ in range(steps) for i in next(feed)["id"]] for _ in range(2)]
    shm = sorted(os.path.basename(p) for p in glob.glob("/dev/shm/[0-9]*_locals"))
    return hvd.allgather_object({"where": where_am_i(), "steps": steps, "ids": ids, "shm": shm})


class Job:
    def __init__(self, cluster: NetnsCluster, spark: Any) -> None:
        self.cluster = cluster
        self.spark = spark
        self.shared = Path(cluster.work) / "shared"
        self.shared.mkdir()

    def prepare(self, pdf: pd.DataFrame, features: str, label: str, where: str) -> Any:
        from hvdrunner.data import prepare

        return prepare(self.spark.createDataFrame(pdf), features=features, label=label,
                       cache_dir=str(self.shared / where), shared=True)  # fmt: skip

    def collectives(self) -> Any:
        from hvdrunner import HorovodRunner

        return HorovodRunner(np=4, start_timeout=120).run(collectives)

    def recipe(self) -> Any:
        from hvdrunner import HorovodRunner

        return HorovodRunner(np=4, start_timeout=120).run(keras_recipe)

    def streaming(self) -> Any:
        """Streaming on 2 hosts x 2 ranks (rows that do not divide), then 3 ranks (2 + 1)."""
        from hvdrunner import HorovodRunner
        from hvdrunner.streaming import write_mds

        data = write_mds(self.spark.range(203).toDF("id").repartition(4),
                         str(self.shared / "mds"), shared=True)  # fmt: skip
        even = HorovodRunner(np=4, start_timeout=120).run(streaming_epochs, data=data)
        try:
            HorovodRunner(np=3, start_timeout=120).run(streaming_epochs, data=data)
            uneven = "no error"
        except Exception as exc:  # noqa: BLE001 - what the user is told is the result
            uneven = str(exc)
        return {"even": even, "uneven": uneven}

    def torch_recipe(self) -> Any:
        from hvdrunner import HorovodRunner

        return HorovodRunner(np=4, start_timeout=120).run(torch_recipe)

    def torch_fit(self) -> Any:
        from hvdrunner import HorovodRunner
        from hvdrunner.torch import fit

        x, y, order, b, r = _linear_rows()
        common = dict(build_model=build_torch_linear, epochs=2, loss="mse", optimizer="sgd",
                      shuffle=False, log_model=False, verbose=0)  # fmt: skip
        four_ckpt, one_ckpt = str(self.shared / "torch-four"), str(self.shared / "torch-one")
        HorovodRunner(np=r, start_timeout=120).run(
            fit, data=self.prepare(pd.DataFrame({"x": x.tolist(), "y": y}), "x", "y", "tfour"),
            batch_size=b, learning_rate=0.01, checkpoint_dir=four_ckpt, **common)  # fmt: skip
        HorovodRunner(np=-1).run(
            fit, data=self.prepare(pd.DataFrame({"x": x[order].tolist(), "y": y[order]}), "x", "y", "tone"),
            batch_size=r * b, learning_rate=0.01 * r, checkpoint_dir=one_ckpt, **common)  # fmt: skip
        import torch

        torch.manual_seed(0)  # what fit starts from: seed 0, then build_model()
        start = build_torch_linear()
        return {"four": torch_weights(four_ckpt, 2), "one": torch_weights(one_ckpt, 2),
                "initial": [start.weight.detach().numpy().tolist()]}  # fmt: skip

    def torch_restarts(self) -> Any:
        """max_restarts=2: rank 3 SIGKILLed in attempt 1, then its whole host killed in
        attempt 2 (a replacement worker starts 3 s later); against the undisturbed job."""
        import faults_on_cluster as foc

        faults = [foc.Fault("rank", 3, 2, attempt=1), foc.Fault("host", 3, 5, attempt=2)]
        restarted = foc.run_job(self, "restarted", faults, max_restarts=2)
        # The undisturbed job's weights, computed exactly (float64) instead of run: a job less.
        verdict, reasons = foc.judge(restarted, foc.exact_weights(), bound_s=300,
                                     atol=foc.EXACT_ATOL)  # fmt: skip
        return {"restarted": restarted, "verdict": verdict, "reasons": reasons}

    def torch_min_np(self) -> Any:
        """max_restarts=1, min_np=2: the host of rank 2 killed in epoch 3 and not replaced
        while the job runs; the restart goes on with the 2 ranks of the surviving host."""
        import faults_on_cluster as foc

        fault = foc.Fault("host", 2, 2, attempt=1, replace_after_s=None)
        return foc.run_job(self, "min-np", [fault], max_restarts=1, min_np=2)

    def torch_concurrent(self) -> Any:
        """Two jobs of np=2 at once on the two hosts, one of them restarting."""
        import faults_on_cluster as foc

        return foc.concurrent_jobs()

    def _failure(self, fn: Any, **kwargs: Any) -> dict[str, Any]:
        from hvdrunner import HorovodRunner, HorovodRunnerError

        t0 = time.monotonic()
        try:
            value = HorovodRunner(np=4, start_timeout=120).run(fn, **kwargs)
        except HorovodRunnerError as exc:
            return {"message": str(exc), "summary": exc.summary, "rank": exc.rank,
                    "exc_type": exc.exc_type, "seconds": time.monotonic() - t0}  # fmt: skip
        return {"message": None, "value": value}

    def unpatched(self) -> Any:
        """As with a horovod hvdrunner did not build: the patch's marker module is moved
        away for the scenario (the executors share this venv), then put back."""
        from unpatched_horovod import marker_hidden

        with marker_hidden():
            return self._failure(unpatched_rank)

    def hidden_cache(self) -> Any:
        # The data layer's check, before any training: on the framework that imports fastest
        # (torch, 1.7 CPU-s a rank against TensorFlow's 6.7 with its Keras).
        from hvdrunner.torch import fit

        rng = np.random.default_rng(1)
        x = rng.normal(size=(256, 4)).astype("float32")
        data = self.prepare(pd.DataFrame({"x": x.tolist(), "y": x.sum(1)}), "x", "y", "hidden")
        victim = self.cluster.hosts[1]
        self.cluster.hide_path(1, str(self.shared / "hidden"))
        out = self._failure(fit, build_model=build_torch_linear, data=data, epochs=1, batch_size=16,
                            loss="mse", log_model=False, verbose=0)  # fmt: skip
        return {**out, "hidden_on": victim.name}

    def host_lost(self) -> Any:
        return self._lose_host("kill")

    def link_cut(self) -> Any:
        return self._lose_host("cut")

    def _lose_host(self, how: str) -> Any:
        """The host without rank 0 is lost mid-training (``kill``: every process in it
        dies; ``cut``: its link goes down, its processes live on), then comes back and the
        same job resumes from its last checkpoint into the same MLflow run."""
        import mlflow
        from digits import arrays, frame

        from hvdrunner import HorovodRunner, HorovodRunnerError
        from hvdrunner.torch import fit

        data = self.prepare(frame(*arrays()), "pixels", "label", "digits")
        mlflow.set_tracking_uri(f"sqlite:///{self.shared / 'mlflow.db'}")
        mlflow.set_experiment("multihost")
        marker, ckpt = self.shared / f"epoch2-{how}.json", self.shared / f"ckpt-{how}"
        kwargs = dict(build_model=build_torch_mlp, data=data, epochs=LOST_HOST_EPOCHS, batch_size=32,
                      loss="cross_entropy", checkpoint_dir=str(ckpt),
                      keep_checkpoints=2, log_model=False, verbose=0)  # fmt: skip
        struck: dict[str, Any] = {}

        def strike() -> None:
            while not marker.exists():
                time.sleep(0.05)
            hosts = json.loads(marker.read_text())
            victim = next(h for h in self.cluster.hosts if h.name != hosts[0])
            struck.update(host=victim.name, ip=victim.addr, index=victim.index,
                          ranks=[r for r, h in enumerate(hosts) if h == victim.name],
                          at=time.monotonic())  # fmt: skip
            if how == "kill":
                self.cluster.kill_host(victim.index)
            else:
                self.cluster.cut_link(victim.index)

        threading.Thread(target=strike, daemon=True).start()
        runner = HorovodRunner(np=4, start_timeout=120, host_timeout=HOST_TIMEOUT_S)
        out: dict[str, Any] = {"host_timeout": HOST_TIMEOUT_S}
        with mlflow.start_run() as run:
            try:
                runner.run(fit_slowly_after_epoch2, marker=str(marker), **kwargs)
                out["message"] = None
            except HorovodRunnerError as exc:
                out.update(message=str(exc), summary=exc.summary, rank=exc.rank,
                           seconds=time.monotonic() - struck.get("at", time.monotonic()))  # fmt: skip
        out["struck"] = struck
        out["status"] = mlflow.get_run(run.info.run_id).info.status
        victim = self.cluster.hosts[struck["index"]]
        survivor = next(h for h in self.cluster.hosts if h is not victim)
        out["left_on_survivor"] = _rank_processes(self.cluster.pids(survivor.index))
        if how == "cut":  # the cut-off host stops its own ranks after host_timeout
            deadline = time.monotonic() + HOST_TIMEOUT_S + 15
            while _rank_processes(self.cluster.pids(victim.index)) and time.monotonic() < deadline:
                time.sleep(0.5)
            out["left_on_cut_host"] = _rank_processes(self.cluster.pids(victim.index))
        out["checkpoints"] = sorted(os.listdir(ckpt))
        # The host comes back; the retry resumes from the last checkpoint, same run.
        if how == "kill":
            self.cluster.start_worker(victim.index)
        else:
            self.cluster.restore_link(victim.index)
        self.cluster.wait_for_executors(self.spark.sparkContext)
        with mlflow.start_run(run_id=run.info.run_id):
            result = HorovodRunner(np=4, start_timeout=180).run(fit, **kwargs)
        out["resumed_at"] = result.initial_epoch
        out["resumed_epochs"] = len(result.history["loss"])
        out["resumed_status"] = mlflow.get_run(run.info.run_id).info.status
        return out


def _linear_rows(b: int = 16, n: int = 512, r: int = 4) -> tuple[Any, Any, Any, int, int]:
    """Rows of a linear problem, and the order in which one rank at batch ``r*b`` sees
    exactly the rows ``r`` ranks at batch ``b`` see together at each step: rank j reads
    rows [j*n/r, (j+1)*n/r) in order, so step k holds block k of every rank's part."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")
    part = n // r
    order = np.concatenate([np.concatenate([np.arange(j * part + k * b, j * part + (k + 1) * b)
                                            for j in range(r)]) for k in range(part // b)])  # fmt: skip
    return x, y, order, b, r


def _rank_processes(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "hvdrunner._launch.rank.worker" in cmd:
            out.append(pid)
    return out


def main(argv: list[str]) -> int:
    why = unavailable()
    if why:
        print(f"SKIP {why}")
        return 3
    mode, wanted = argv[0], argv[1:] or list(SCENARIOS)
    from hvdrunner.spark import local_session

    with NetnsCluster(hosts=2, mode=mode) as cluster:
        spark = local_session(cluster.master_url, app_name=f"hvdrunner-multihost-{mode}",
                              **cluster.driver_conf())  # fmt: skip
        cluster.wait_for_executors(spark.sparkContext)
        job = Job(cluster, spark)
        print("CLUSTER " + json.dumps({"prefix": cluster.prefix,
                                       "hosts": [h.name for h in cluster.hosts]}), flush=True)  # fmt: skip
        for name in wanted:
            t0 = time.monotonic()
            try:
                out = {"value": getattr(job, name)()}
            except Exception as exc:  # noqa: BLE001 - reported per scenario
                out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            out["wall_s"] = round(time.monotonic() - t0, 1)
            print(f"RESULT {name} " + json.dumps(out, default=str), flush=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
