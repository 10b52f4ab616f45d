"""Mixed precision, activation checkpointing and memory reporting for the trainer.

All three are device-agnostic: bf16 autocast runs on CPU too (slowly), so the
code path the GPU takes is the one the CPU tests exercise.
"""

from __future__ import annotations

import resource
import sys

import torch

from ..agents.policy import WrapsBaseModel



def enable_gradient_checkpointing(model) -> None:
    """Recompute activations in backward instead of storing them (non-reentrant,
    which works with frozen inputs and LoRA)."""
    base = model.get_base_model() if isinstance(model, WrapsBaseModel) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(base).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(base, "enable_input_require_grads"):
        base.enable_input_require_grads()  # needed when the embeddings are frozen (LoRA)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_report(device: torch.device) -> dict[str, float]:
    """Peak memory since the last reset: GPU allocated/reserved in GiB, or the
    process's peak resident set on CPU (monotone: the OS keeps no resettable peak)."""
    if device.type == "cuda":
        gib = 2.0 ** 30
        return {"mem/peak_allocated_gib": torch.cuda.max_memory_allocated(device) / gib,
                "mem/peak_reserved_gib": torch.cuda.max_memory_reserved(device) / gib}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1.0 if sys.platform == "darwin" else 1024.0  # bytes on macOS, KiB on Linux
    return {"mem/peak_rss_gib": peak * scale / 2.0 ** 30}
