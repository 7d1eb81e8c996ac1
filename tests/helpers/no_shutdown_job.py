"""A correct 2-rank Horovod recipe on hvdrunner.hvd_torch that ends without hvd.shutdown():
rank 0 writes ``trained`` to ARGV[1]; the interpreter's exit must then be clean
(tests/test_engine_hostile.py)."""

import sys

import torch

import hvdrunner.hvd_torch as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())  # fmt: skip
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for _ in range(20):
    loss = model(torch.randn(16, 20)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    hvd.allreduce(loss.detach(), name="loss")
if hvd.rank() == 0:
    with open(sys.argv[1], "w") as f:
        f.write("trained")
