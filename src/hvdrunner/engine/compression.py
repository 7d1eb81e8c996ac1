"""Horovod's gradient compression: ``Compression.none`` and ``Compression.fp16`` (floating
tensors travel as float16 and come back in their own type).

Example:
    >>> import torch
    >>> sent, ctx = Compression.fp16.compress(torch.tensor([1.5], dtype=torch.float64))
    >>> sent.dtype, Compression.fp16.decompress(sent, ctx).dtype
    (torch.float16, torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Turns a tensor into what is sent, and back."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating tensors as float16."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating_point:
            tensor = tensor.type(torch.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.type(ctx) if ctx.is_floating_point else tensor


class Compression:
    """The compressors by Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor
