"""Faults on the two-host cluster during ``hvdrunner.torch.fit`` jobs: a rank SIGKILLed, a
whole host killed (and a replacement started, as Databricks replaces a lost node), at a
chosen or a seeded random moment. Used by the ``torch_restarts`` scenario of
tests/helpers/multihost_job.py and by benchmarks/chaos.py.

A job is ``hvdrunner.torch.fit`` of a linear model on 512 rows, 4 ranks (2 per host), one
checkpoint per epoch in a folder every host sees, MLflow in a sqlite store there. Its
outcome is judged against the undisturbed job's final weights and metrics:

- ``recovered``: finished, weights within tolerance, one FINISHED run, each step once;
- ``failed-loudly``: ``HorovodRunnerError`` naming the fault (lost host / died rank),
  bounded, run FAILED, no rank process left;
- anything else (a hang, different weights, a RUNNING run, a leftover process, missing
  or doubled steps) is a defect, and its reasons are listed.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EPOCHS = 8
ROWS, BATCH, RANKS = 512, 16, 4
#: The weights of a disturbed job must equal the undisturbed one's this closely (measured:
#: equal to float32 rounding, the resume replays the same batches from the same state).
WEIGHT_ATOL = 1e-5
#: Against :func:`exact_weights` (float64): an undisturbed 4-rank job measured 1.3e-7 away.
EXACT_ATOL = 1e-5


@dataclass(frozen=True)
class Fault:
    """``kind``: ``rank`` (SIGKILL one rank) or ``host`` (SIGKILL every process of the host
    holding ``rank``, then start its worker again after ``replace_after_s``); strikes in
    ``attempt`` once epoch ``epoch`` (0-based) has begun."""

    kind: str
    rank: int
    epoch: int
    attempt: int = 1
    delay_s: float = 0.0  # after the epoch began
    replace_after_s: float | None = 3.0  # None: no replacement while the job runs

    def describe(self) -> str:
        what = f"rank {self.rank} SIGKILLed" if self.kind == "rank" else (
            f"the host of rank {self.rank} killed")  # fmt: skip
        return f"{what} {self.delay_s:.2f}s into epoch {self.epoch + 1} of attempt {self.attempt}"


# -- in the ranks ------------------------------------------------------------------------------
def build_linear() -> Any:
    import torch

    return torch.nn.Linear(4, 1)


def fit_under_faults(work: str, faults: list[dict[str, Any]], slow_s: float, **kwargs: Any) -> Any:
    """``hvdrunner.torch.fit``; each epoch takes at least ``slow_s`` (so a fault lands mid
    training); each rank notes its host per attempt and each epoch it begins; a ``rank``
    fault SIGKILLs its rank ``delay_s`` after its epoch began, whatever it is doing then
    (host faults are struck by the driver)."""
    import socket

    from hvdrunner.distributed import attempt, rank
    from hvdrunner.torch import fit, loop

    Path(work, f"host-a{attempt()}-r{rank()}").write_text(socket.gethostname())
    train_epoch = loop.Trainer._train_epoch

    def epoch_with_faults(self: Any, feed: Any, epoch: int) -> Any:
        Path(work, f"epoch-a{attempt()}-r{rank()}-e{epoch}").touch()
        for f in faults:
            if f["kind"] == "rank" and (f["attempt"], f["rank"], f["epoch"]) == (
                attempt(), rank(), epoch):  # fmt: skip
                threading.Timer(f["delay_s"], os.kill, (os.getpid(), signal.SIGKILL)).start()
        logs = train_epoch(self, feed, epoch)
        time.sleep(slow_s)
        return logs

    loop.Trainer._train_epoch = epoch_with_faults  # type: ignore[method-assign]
    return fit(**kwargs)


# -- on the driver -----------------------------------------------------------------------------
def _rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")


def linear_data(job: Any, name: str) -> Any:
    import pandas as pd

    x, y = _rows()
    return job.prepare(pd.DataFrame({"x": x.tolist(), "y": y}), "x", "y", name)


def exact_weights() -> dict[str, Any]:
    """What the undisturbed 4-rank job computes, in float64 numpy: fit's start (seed 0, then
    ``build_linear()``), then SGD at 0.01 x 4 where update k of an epoch averages block k of
    every rank's quarter of the rows (no shuffle)."""
    import torch
    from sgd_reference import linear_sgd

    x, y = _rows()
    torch.manual_seed(0)
    start = build_linear()
    per = ROWS // RANKS
    updates = [np.concatenate([np.arange(j * per + k * BATCH, j * per + (k + 1) * BATCH)
                               for j in range(RANKS)]) for k in range(per // BATCH)] * EPOCHS  # fmt: skip
    w, b = linear_sgd(start.weight.detach().numpy().T, start.bias.detach().numpy(), x, y,
                      updates, lr=0.01 * RANKS)  # fmt: skip
    return {"weights": [w.T.ravel().tolist(), b.ravel().tolist()]}


def final_weights(ckpt: Path) -> list[list[float]]:
    import torch

    state = torch.load(ckpt / f"epoch-{EPOCHS:05d}" / "model.pt")
    return [v.numpy().ravel().tolist() for v in state.values()]


def _strike_hosts(job: Any, work: Path, faults: list[Fault], struck: list[dict[str, Any]],
                  stop: threading.Event) -> None:  # fmt: skip
    """Driver thread: each host fault strikes once its rank has begun its epoch."""
    for f in (f for f in faults if f.kind == "host"):
        mark = work / f"epoch-a{f.attempt}-r{f.rank}-e{f.epoch}"
        while not mark.exists():
            if stop.wait(0.05):
                return
        if stop.wait(f.delay_s):
            return
        name = (work / f"host-a{f.attempt}-r{f.rank}").read_text()
        victim = next(h for h in job.cluster.hosts if h.name == name)
        job.cluster.kill_host(victim.index)
        struck.append({"host": name, "at": time.monotonic()})
        if f.replace_after_s is not None and not stop.wait(f.replace_after_s):
            _replacements(job).put(victim.index)


def _replacements(job: Any) -> queue.Queue[int]:
    """Host indexes whose worker a long-lived thread starts again. (A worker dies with the
    thread that started it - its PR_SET_PDEATHSIG follows the thread - so not the striker's.)"""
    if not hasattr(job, "replacements"):
        job.replacements = queue.Queue()

        def serve() -> None:
            while True:
                job.cluster.start_worker(job.replacements.get())

        threading.Thread(target=serve, name="replacement-nodes", daemon=True).start()
    return job.replacements  # type: ignore[no-any-return]


def run_job(job: Any, name: str, faults: list[Fault], max_restarts: int,
            slow_s: float = 0.3, start_timeout: float = 120, min_np: int | None = None,
            ) -> dict[str, Any]:  # fmt: skip
    """One fit job under ``faults``; what happened, for :func:`judge`."""
    import mlflow

    from hvdrunner import HorovodRunner, HorovodRunnerError

    work = job.shared / name
    work.mkdir()
    ckpt = work / "ckpt"
    mlflow.set_tracking_uri(f"sqlite:///{job.shared / 'mlflow.db'}")
    mlflow.set_experiment("faults")
    data = job.data if hasattr(job, "data") else linear_data(job, "faults-data")
    job.data = data
    struck: list[dict[str, Any]] = []
    stop = threading.Event()
    striker = threading.Thread(target=_strike_hosts, args=(job, work, faults, struck, stop),
                               daemon=True)  # fmt: skip
    striker.start()
    out: dict[str, Any] = {"faults": [f.describe() for f in faults], "max_restarts": max_restarts}
    t0 = time.monotonic()
    runner = HorovodRunner(np=RANKS, max_restarts=max_restarts, start_timeout=start_timeout,
                           host_timeout=8.0, timeout=600, min_np=min_np)  # fmt: skip
    with mlflow.start_run() as run:
        try:
            result = runner.run(fit_under_faults, work=str(work), faults=[f.__dict__ for f in faults],
                       slow_s=slow_s, build_model=build_linear, data=data, epochs=EPOCHS,
                       batch_size=BATCH, loss="mse", optimizer="sgd", learning_rate=0.01,
                       shuffle=False, log_model=False, verbose=0, checkpoint_dir=str(ckpt))  # fmt: skip
            out.update(error=None, num_ranks=result.num_ranks,
                       steps_per_epoch=result.steps_per_epoch)  # fmt: skip
        except HorovodRunnerError as exc:
            out.update(error=exc.summary, cause=exc.cause, attempts=exc.attempts)
    out["seconds"] = round(time.monotonic() - t0, 1)
    stop.set()
    striker.join(timeout=30)
    out["struck_hosts"] = [s["host"] for s in struck]
    out.update(_run_record(run.info.run_id))
    out["weights"] = final_weights(ckpt) if out["error"] is None else None
    out["left"] = _rank_processes_anywhere(job)
    time.sleep(max((f.replace_after_s or 0 for f in faults if f.kind == "host"), default=0))
    for host in job.cluster.hosts:  # a struck host whose replacement came late
        if host.worker is None or host.worker.poll() is not None:
            _replacements(job).put(host.index)
    job.cluster.wait_for_executors(job.spark.sparkContext, timeout=180)
    return out


def _run_record(run_id: str) -> dict[str, Any]:
    import mlflow

    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    keys = [k for k in run.data.metrics if not k.startswith("hvdrunner.")]
    steps = {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in keys}
    loss = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step) if keys else []
    return {"status": run.info.status, "steps": steps, "loss": [m.value for m in loss],
            "num_ranks_changed": run.data.tags.get("param_changed.num_ranks"),
            "restarts": int(run.data.tags.get("hvdrunner.restarts", "0")),
            "restart_causes": [v for k, v in sorted(run.data.tags.items())
                               if k.startswith("hvdrunner.attempt.")]}  # fmt: skip


def _rank_processes_anywhere(job: Any) -> list[int]:
    """Rank processes still alive in any host of the cluster, a moment after the job."""
    deadline = time.monotonic() + 5
    while True:
        left = []
        for host in job.cluster.hosts:
            for pid in job.cluster.pids(host.index):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"hvdrunner._launch.rank.worker" in cmd:
                    left.append(pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def judge(
    out: dict[str, Any], reference: dict[str, Any], bound_s: float, atol: float = WEIGHT_ATOL
) -> tuple[str, list[str]]:
    """``("recovered" | "failed-loudly" | "defect", reasons)`` for one job's record, against
    ``reference["weights"]`` (the undisturbed job's, or :func:`exact_weights`) within ``atol``."""
    bad = []
    if out["left"]:
        bad.append(f"rank processes left: {out['left']}")
    if out["status"] == "RUNNING":
        bad.append("MLflow run left RUNNING")
    if out["seconds"] > bound_s or out.get("cause") == "timeout":
        bad.append(f"took {out['seconds']}s (bound {bound_s}s): a hang")
    if out["error"] is None:
        if out["status"] != "FINISHED":
            bad.append(f"finished but the run is {out['status']}")
        for key, steps in out["steps"].items():
            if steps != list(range(EPOCHS)):
                bad.append(f"metric {key} steps {steps}")
        diff = max(abs(a - b) for w, r in zip(out["weights"], reference["weights"], strict=True)
                   for a, b in zip(w, r, strict=True))  # fmt: skip
        out["max_weight_diff"] = diff
        if diff > atol:
            bad.append(f"weights differ from the undisturbed job's by {diff:.2e}")
        return ("defect" if bad else "recovered"), bad
    named = ("Lost host", "died (SIGKILL", "max_restarts")
    if not any(n in out["error"] + " ".join(out.get("attempts") or []) for n in named):
        bad.append(f"the error does not name the fault: {out['error'][:200]}")
    if out["status"] != "FAILED":
        bad.append(f"failed but the run is {out['status']}")
    return ("defect" if bad else "failed-loudly"), bad


# -- two jobs at once --------------------------------------------------------------------------
def summed(value: float, die_once: bool, hold_s: float) -> dict[str, Any]:
    """In the ranks: allreduce ``value`` twice, ``hold_s`` apart (holding the slots); rank 1
    of attempt 1 is SIGKILLed first when ``die_once``."""
    import socket

    import torch

    import hvdrunner.hvd_torch as hvd
    from hvdrunner.distributed import attempt

    hvd.init()
    if die_once and attempt() == 1 and hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    total = hvd.allreduce(torch.tensor(value), op=hvd.Sum).item()
    time.sleep(hold_s)
    again = hvd.allreduce(torch.tensor(value), op=hvd.Sum).item()
    return {"total": total, "again": again, "attempt": attempt(),
            "hosts": hvd.allgather_object(socket.gethostname())}  # fmt: skip


def concurrent_jobs() -> dict[str, Any]:
    """Jobs a and b (np=2 each) at once from two threads on the 4 slots of the two hosts; b's
    rank 1 SIGKILLed in its first attempt (max_restarts=1). Each job's sums must be its own."""
    from hvdrunner import HorovodRunner

    out: dict[str, Any] = {}

    def job(name: str, value: float, restarts: int) -> None:
        try:
            out[name] = HorovodRunner(np=2, start_timeout=120, max_restarts=restarts).run(
                summed, value=value, die_once=restarts > 0, hold_s=6.0
            )
        except Exception as exc:  # noqa: BLE001 - reported per job
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}

    threads = [threading.Thread(target=job, args=("a", 1.0, 0)),
               threading.Thread(target=job, args=("b", 3.0, 1))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return out
