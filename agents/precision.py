"""Mixed-precision context shared by the sampler, the scorers and the trainer, so all
three compute in the same numerics when ``model.autocast`` is set."""

from __future__ import annotations

import contextlib

import torch

_AUTOCAST = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def autocast(precision: str | None, device: torch.device):
    """A ``torch.autocast`` context for ``precision`` (bfloat16/float16), or a no-op
    for ``None``/``float32``.  Log-probs are always taken in float32 afterwards
    (``token_logprobs`` upcasts), so the ratio and the loss stay exact-ish."""
    if precision in (None, "", "float32", "fp32"):
        return contextlib.nullcontext()
    try:
        dtype = _AUTOCAST[precision]
    except KeyError:
        raise ValueError(f"unknown autocast precision {precision!r}; use bfloat16, float16 "
                         "or float32") from None
    if device.type == "cpu" and dtype is torch.float16:
        raise ValueError("float16 autocast needs a GPU; use bfloat16 on CPU")
    return torch.autocast(device_type=device.type, dtype=dtype)
