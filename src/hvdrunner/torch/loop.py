"""The epoch loop of :func:`hvdrunner.torch.fit`: train, validate, average, check, save, log.

Every rank runs the same number of steps (the data feed guarantees it) and the same
collectives in the same order: gradient allreduces inside ``optimizer.step()``, one metric
allreduce per epoch, one weight-sync allgather after the first epoch. Only rank 0 prints,
checkpoints and writes to MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hvdrunner._logging import log_to_driver
from hvdrunner.core import recipe, schedule
from hvdrunner.distributed import is_rank0, size
from hvdrunner.torch import collectives
from hvdrunner.torch.config import FitConfig
from hvdrunner.torch.inputs import batches
from hvdrunner.torch.options import LOSSES, METRICS, resolve


def _forward(model: torch.nn.Module, x: Any) -> torch.Tensor:
    return model(**x) if isinstance(x, dict) else model(x)


class Trainer:
    """One rank's training of a fit's model under its (already distributed) optimizer.

    ``run.built.extra``: each param group's scaled rate as built, before any checkpoint
    restore (a restored state holds the rate of the moment it was saved, mid-warmup perhaps).
    """

    def __init__(self, run: recipe.FitRun[FitConfig], device: torch.device) -> None:
        self.fit_run, self.device = run, device
        self.model, self.opt, self.lr = run.built.model, run.built.optimizer, run.built.lr
        self.cfg, self.steps, self.store, self.ledger = run.cfg, run.steps, run.store, run.ledger
        self.loss = resolve(run.cfg.loss, LOSSES)[1]
        self.metrics = [resolve(m, METRICS) for m in run.cfg.metrics]
        self.group_lrs = list(run.built.extra)

    def run(self) -> tuple[dict[str, list[float]], Any]:
        """Epochs ``initial_epoch..epochs-1``; the averaged history and a few input rows."""
        cfg, initial_epoch = self.cfg, self.fit_run.initial_epoch
        feed = batches(self.fit_run.feed, cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed,
                       first_epoch=initial_epoch, device=self.device, in_memory=cfg.in_memory)  # fmt: skip
        val = self._validation_feed(self.fit_run.validation)
        history: dict[str, list[float]] = {}
        example = None
        for epoch in range(initial_epoch, cfg.epochs):
            start = time.monotonic()
            logs, first = self._train_epoch(feed, epoch)
            example = example if example is not None else first
            if val is not None:
                logs |= {f"val_{k}": v for k, v in self._evaluate(*val).items()}
            averaged = collectives.average_metrics(logs)
            logs = {k: averaged[k] for k in logs}  # loss, metrics, val_*: as computed
            if epoch == initial_epoch:  # the first synchronized epoch of this run
                collectives.check_in_sync(self.model)
            self._epoch_end(epoch, logs, time.monotonic() - start)
            for k, v in logs.items():
                history.setdefault(k, []).append(v)
        return history, example

    def _validation_feed(self, validation: Any) -> tuple[Iterator[Any], int] | None:
        if validation is None:
            return None
        vb = min(self.cfg.batch_size, validation.rows_per_rank())
        feed = batches(
            validation, vb, shuffle=False, device=self.device, in_memory=self.cfg.in_memory
        )
        return feed, validation.steps_per_epoch(vb)

    def _set_lr(self, epoch: float) -> None:
        factor = schedule.warmup_multiplier(epoch, size(), self.cfg.warmup_epochs)
        for group, lr in zip(self.opt.param_groups, self.group_lrs, strict=True):
            group["lr"] = lr * factor

    def _train_epoch(self, feed: Iterator[Any], epoch: int) -> tuple[dict[str, float], Any]:
        """``steps`` batches; local means of loss and metrics; the first batch's inputs."""
        self.model.train()
        n = self.cfg.backward_passes_per_step
        sums = torch.zeros(1 + len(self.metrics), dtype=torch.float64, device=self.device)
        first = None
        for step in range(self.steps):
            x, y = next(feed)
            if first is None:
                first = _example(x)
            self._set_lr(epoch + step / self.steps)
            out = _forward(self.model, x)
            loss = self.loss(out, y)
            (loss / n).backward()  # N passes' gradients add up: /N makes them an average
            if (step + 1) % n == 0 or step + 1 == self.steps:
                self.opt.step()
                self.opt.zero_grad()
            sums += self._values(loss, out, y)
        return self._means(sums, self.steps), first

    @torch.no_grad()
    def _evaluate(self, feed: Iterator[Any], steps: int) -> dict[str, float]:
        self.model.eval()
        sums = torch.zeros(1 + len(self.metrics), dtype=torch.float64, device=self.device)
        for _ in range(steps):
            x, y = next(feed)
            out = _forward(self.model, x)
            sums += self._values(self.loss(out, y), out, y)
        return self._means(sums, steps)

    def _values(self, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # On the device, no .item() per step: one host sync per epoch, not per batch.
        with torch.no_grad():
            parts = [loss.detach()] + [fn(out, y).detach() for _, fn in self.metrics]
            return torch.stack([p.to(torch.float64).reshape(()) for p in parts])

    def _means(self, sums: torch.Tensor, steps: int) -> dict[str, float]:
        names = ["loss"] + [name for name, _ in self.metrics]
        return dict(zip(names, (sums / steps).tolist(), strict=True))

    def _epoch_end(self, epoch: int, logs: dict[str, float], seconds: float) -> None:
        """Rank 0: the progress line, the metrics into MLflow, the checkpoint."""
        done = epoch + 1
        if not is_rank0():
            return
        if self.cfg.verbose:  # progress, not a status line: to the driver's output as "[0] ..."
            shown = " - ".join(f"{k} {v:.4f}" for k, v in logs.items())
            log_to_driver(f"epoch {done}/{self.cfg.epochs} - {shown} ({seconds:.1f} s)")
        self.ledger.epoch_end(epoch, logs)
        every = self.cfg.checkpoint_every
        if self.store is not None and recipe.checkpoint_due(done, every, self.cfg.epochs):
            recipe.save_checkpoint(self.store, self.ledger, self.model, self.opt, done)


def _example(x: Any) -> Any:
    """A few input rows as numpy, for the logged model's signature."""
    if isinstance(x, dict):
        return {k: v[:5].detach().cpu().numpy() for k, v in x.items()}
    return np.asarray(x[:5].detach().cpu().numpy())
