"""Horovod's ``SyncBatchNorm``: batch normalisation whose statistics cover every rank's batch.

In training, each rank's mean and variance over its batch, with the number of its elements,
are gathered from every rank and combined (``global_stats``), so every rank normalises with
the global mean and variance, in the input's precision (float32 for 16-bit inputs), stable at
any mean (statistics accumulated as torch's own batch norm accumulates them); backward sums
the two gradient terms over the ranks. The weight and bias gradients stay each rank's own (the
``DistributedOptimizer`` averages them), as in Horovod and torch.

Example:
    >>> from hvdrunner.engine import state
    >>> import torch
    >>> state.init()
    >>> SyncBatchNorm(3)(torch.randn(4, 3)).shape
    torch.Size([4, 3])
    >>> state.shutdown()
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's usual name
from torch.nn.modules.batchnorm import _BatchNorm

from hvdrunner.engine import collectives, state
from hvdrunner.engine.ops import SUM


def _dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _shape(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


def _acc_type(x: torch.Tensor) -> torch.dtype:
    """The type statistics are accumulated in: torch's own for batch norm (``acc_type``):
    float64 on the CPU for float32 and float64 inputs, float32 on GPUs and for 16-bit ones."""
    if x.dtype == torch.float64 or (x.dtype == torch.float32 and x.device.type == "cpu"):
        return torch.float64
    return torch.float32


def _compute_type(x: torch.Tensor) -> torch.dtype:
    """The type inputs are normalised in: the input's, float32 for 16-bit inputs."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def global_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mean and (biased) variance per channel over every rank's batch (accumulated as torch's
    batch norm does, returned in the type the input is normalised in), and the number of
    elements per channel. Each rank's mean and variance are taken about its own mean, then
    combined with the ranks' counts (Chan's parallel formula): no ``E[x^2] - E[x]^2``, whose
    cancellation loses every digit at a large mean. Ranks may hold batches of different sizes.
    """
    dims, acc = _dims(x), _acc_type(x)
    xf = x.to(acc)
    var, mean = torch.var_mean(xf, dims, correction=0)
    count = torch.full((1,), x.numel() / x.shape[1], dtype=acc, device=x.device)
    every = collectives.allgather(torch.cat([count, mean, var]).unsqueeze(0), name=None)
    c = x.shape[1]
    counts, means, variances = every[:, :1], every[:, 1 : 1 + c], every[:, 1 + c :]
    n = counts.sum()
    mean_all = (counts * means).sum(0) / n
    var_all = (counts * (variances + (means - mean_all) ** 2)).sum(0) / n
    compute = _compute_type(x)
    return mean_all.to(compute), var_all.to(compute), float(n.item())


class _SyncNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float,
                momentum: float) -> torch.Tensor:  # fmt: skip
        mean, var, n = global_stats(x)
        xf = x.to(mean.dtype)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype) * momentum)
                unbiased = var * (n / max(n - 1.0, 1.0))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype) * momentum)
        xhat = (xf - mean.view(_shape(x))) * invstd.view(_shape(x))
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n = n
        out = xhat
        if weight is not None:
            out = out * weight.to(xf.dtype).view(_shape(x))
        if bias is not None:
            out = out + bias.to(xf.dtype).view(_shape(x))
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        xhat, invstd, weight = ctx.saved_tensors
        dims, shape = _dims(dy), _shape(dy)
        dyf = dy.to(xhat.dtype)
        local_dy, local_dy_xhat = dyf.sum(dims), (dyf * xhat).sum(dims)
        sum_dy, sum_dy_xhat = collectives.grouped_allreduce([local_dy, local_dy_xhat], op=SUM)
        scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
        dx = scale.view(shape) * (dyf - (sum_dy / ctx.n).view(shape)
                                  - xhat * (sum_dy_xhat / ctx.n).view(shape))  # fmt: skip
        grad_w = local_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_b = local_dy.to(weight.dtype) if weight is not None else None
        return dx.to(dy.dtype), grad_w, grad_b, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm*d`` with statistics over every rank's batch (any input of at least
    two dimensions: ``(N, C, ...)``)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:  # fmt: skip
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:  # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        if not self.training or state.size() == 1:
            use_batch = self.training or not self.track_running_stats
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, use_batch, momentum, self.eps)  # fmt: skip
        return _SyncNorm.apply(input, self.weight, self.bias, self.running_mean,
                               self.running_var, self.eps, momentum)  # fmt: skip
