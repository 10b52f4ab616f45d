"""Policy-gradient losses on per-token advantages.

PPO-clip with asymmetric clip range (``clip_high`` > ``clip_low`` is DAPO's
clip-higher)::

    ratio = exp(logp - old_logp)
    L_pg  = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)

KL to a frozen reference uses the k3 estimator (Schulman), always >= 0::

    k3 = exp(ref - logp) - (ref - logp) - 1
"""

from __future__ import annotations

import torch


def ppo_clip_terms(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                   clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss and a 0/1 tensor of where clipping was active."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, denom: float | None = None
              ) -> torch.Tensor:
    """``token_mean``: sum over masked tokens / ``denom`` (global token count of the
    mini-batch, so micro-batching does not change the loss); ``seq_mean_token_mean``:
    mean over tokens of each row, summed over rows / ``denom`` (row count)."""
    if mode == "token_mean":
        d = denom if denom is not None else mask.sum().clamp(min=1.0)
        return (per_token * mask).sum() / d
    if mode == "seq_mean_token_mean":
        per_row = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        d = denom if denom is not None else float(per_row.shape[0])
        return per_row.sum() / d
    raise ValueError(f"unknown loss_agg {mode!r}; use token_mean or seq_mean_token_mean")
