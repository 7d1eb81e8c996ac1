"""One rank of a 2-rank torchrun job that makes, uses and destroys a gloo process group
CYCLES times through ``engine/keepalive.py``, then prints ``destroyed N groups``.

Each cycle's collectives take tensors Python drops at once, so a gloo worker often drops the
last reference just as the group goes. On torch < 2.8 (pytorch#154976) a plain
``dist.destroy_process_group`` joins that worker holding the GIL the worker needs: measured
on torch 2.3.1, 3 runs of 300 cycles out of 3 deadlocked. keepalive joins it with the GIL
released."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from hvdrunner.engine import keepalive

cycles = int(sys.argv[1])
dist.init_process_group("gloo")
for _ in range(cycles):
    group = dist.new_group([0, 1], backend="gloo")
    for _ in range(3):
        dist.all_reduce(torch.ones(1000), group=group)
    keepalive.destroy(group)
    del group
    keepalive.join()
keepalive.destroy_default()
keepalive.join()
print(f"destroyed {cycles} groups", flush=True)
