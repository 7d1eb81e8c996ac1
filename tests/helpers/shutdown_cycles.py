"""One rank of a 2-rank job that joins and leaves the engine CYCLES times (init, one
allreduce, shutdown), then prints ``left N times``. Before the fix, on torch < 2.8 (the 15.4
replica's 2.3.1), a shutdown deadlocked the rank in about one job in four: a process group's
destructor held the GIL while a gloo worker needed it to free the last round's tensors."""

from __future__ import annotations

import sys

import torch

import hvdrunner.hvd_torch as hvd

cycles = int(sys.argv[1])
for _ in range(cycles):
    hvd.init()
    hvd.allreduce(torch.ones(1), name="cycle")
    hvd.shutdown()
print(f"left {cycles} times", flush=True)
