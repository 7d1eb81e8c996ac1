"""Horovod's ``SyncBatchNorm``: batch normalisation whose statistics cover every rank's batch.

In training, each rank's sums over its batch (and the number of its elements) are summed over
the ranks, so every rank normalises with the global mean and variance; backward sums the two
gradient terms the same way. The weight and bias gradients stay each rank's own (the
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


class _SyncNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float,
                momentum: float) -> torch.Tensor:  # fmt: skip
        dims = _dims(x)
        xf = x.float()
        count = torch.tensor([x.numel() / x.shape[1]], dtype=torch.float32, device=x.device)
        total, squares, counted = collectives.grouped_allreduce(
            [xf.sum(dims), (xf * xf).sum(dims), count], op=SUM, name=None)  # fmt: skip
        n = float(counted.item())
        mean = total / n
        var = squares / n - mean * mean
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
            out = out * weight.float().view(_shape(x))
        if bias is not None:
            out = out + bias.float().view(_shape(x))
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        xhat, invstd, weight = ctx.saved_tensors
        dims, shape = _dims(dy), _shape(dy)
        dyf = dy.float()
        local_dy, local_dy_xhat = dyf.sum(dims), (dyf * xhat).sum(dims)
        sum_dy, sum_dy_xhat = collectives.grouped_allreduce([local_dy, local_dy_xhat], op=SUM)
        scale = invstd if weight is None else invstd * weight.float()
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
