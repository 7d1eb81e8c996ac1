"""One rank of a 2-rank job that joins and leaves the engine CYCLES times (init; collectives
on the control group, the data group, a process set's groups and the gradient lane;
shutdown), then prints ``left N times``.

On torch < 2.8 (the 15.4 replica's 2.3.1) a process group's destructor joins its gloo
workers holding the GIL; a worker that drops a collective's tensors just after Python did
needs the GIL to free them, so a shutdown right after a collective deadlocked the rank. The
engine joins them with the GIL released once nothing refers to the groups
(engine/keepalive.py): each cycle checks that nothing does."""

from __future__ import annotations

import sys

import torch

import hvdrunner.hvd_torch as hvd
from hvdrunner.engine import keepalive

cycles = int(sys.argv[1])
for cycle in range(cycles):
    hvd.init()
    hvd.allreduce(torch.ones(1), name="cycle")  # small: travels inside the round
    hvd.allreduce(torch.ones(50_000), name="cycle.data")  # the data group
    hvd.allgather(torch.ones(hvd.rank() + 1, 10), name="cycle.allgather")
    one = hvd.add_process_set([cycle % 2])  # rank 0's, then rank 1's
    if hvd.rank() in one.ranks:
        hvd.broadcast(torch.ones(1000), root_rank=cycle % 2, name="cycle.set", process_set=one)
    model = torch.nn.Linear(8, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())  # fmt: skip
    model(torch.ones(4, 8)).sum().backward()
    opt.step()  # the gradient lane
    hvd.shutdown()
    if keepalive.pending():
        sys.exit(f"cycle {cycle}: {keepalive.pending()} destroyed group(s) still referred to")
print(f"left {cycles} times", flush=True)
