"""Model numerics shared by the sampler, the credit scorers and the trainer.

One place for: the mixed-precision context (``model.autocast``), a forward pass
under it, per-token log-probs and entropies (always in float32), padding token
rows into a batch, and the KV-cache plumbing of a cached forward.  The sampler,
the gold-answer scorer, the entropy screen of branch credit and the PPO update
all call these, so they compute in the same numerics: the first importance ratio
of an update is 1 up to float rounding.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Sequence

import torch

from .policy import WrapsBaseModel

__all__ = [
    "autocast", "model_device", "forward_logits", "token_logprobs", "token_entropies",
    "right_pad", "cache_kwarg", "cache_of", "growing_cache", "sequence_logprobs",
    "sequence_entropies", "tempered", "restricted",
]

_AUTOCAST = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def autocast(precision: str | None, device: torch.device):
    """A ``torch.autocast`` context for ``precision`` (bfloat16/float16), or a no-op
    for ``None``/``float32``.  Log-probs are always taken in float32 afterwards
    (:func:`token_logprobs` upcasts), so ratios and losses stay exact-ish."""
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


def forward_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   precision: str | None = None) -> torch.Tensor:
    """Logits of a plain (uncached) forward under ``precision``'s autocast.  No KV cache
    is built: training and scoring forwards never need one."""
    with autocast(precision, input_ids.device):
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``: the logits of the distribution a sampler at that
    temperature draws from (``logits`` itself, not a copy, at 1.0).  Divided in float32,
    as the samplers do: bf16 autocast logits divided in bf16 round by up to ~0.07 nats."""
    if temperature == 1.0:
        return logits
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return logits.float() / temperature


def restricted(logits: torch.Tensor, restrictions: Sequence[Sequence] | None) -> torch.Tensor:
    """``logits`` [B, L, V] with, for every (position p, allowed ids) of row b's
    restriction, the logits that predict token p (``logits[b, p - 1]``) set to -inf
    outside the allowed ids: the distribution a constrained sampler drew that token from
    (agents.constraints).  Out of place and differentiable; ``logits`` itself when no
    row is restricted."""
    if not restrictions or not any(restrictions):
        return logits
    rows, cols, sub_r, sub_t = [], [], [], []
    for b, res in enumerate(restrictions):
        for pos, allowed in res or ():
            k = len(rows)
            rows.append(b)
            cols.append(pos - 1)
            sub_r.extend([k] * len(allowed))
            sub_t.extend(allowed)
    dev = logits.device
    r_idx = torch.tensor(rows, device=dev)
    c_idx = torch.tensor(cols, device=dev)
    sub = logits[r_idx, c_idx]  # [P, V]
    keep = torch.zeros(sub.shape, dtype=torch.bool, device=dev)
    keep[torch.tensor(sub_r, device=dev), torch.tensor(sub_t, device=dev)] = True
    return logits.index_put((r_idx, c_idx), sub.masked_fill(~keep, float("-inf")))


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of ``ids[:, i]`` under ``logits[:, i-1]``; column 0 is 0.  Shape [B, L]."""
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def token_entropies(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the distribution that produced each token: column i is the
    entropy of ``logits[:, i-1]``, column 0 is 0.  Shape [B, L]."""
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    # restricted logits (-inf) have p = 0: 0 * log 0 is 0 here, not nan
    ent = -(lp.exp() * torch.nan_to_num(lp, neginf=0.0)).sum(-1)
    return torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both [B, max len], rows left-aligned."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def _batches_by_budget(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Index batches, longest first, with rows x width <= budget (at least one row each)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * width > budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


@torch.no_grad()
def _per_sequence(model, seqs: Sequence[Sequence[int]], pad_id: int, budget: int,
                  precision: str | None, fn, restrictions: Sequence | None = None
                  ) -> list[list[float]]:
    device = model_device(model)
    was = model.training
    model.eval()
    out: list = [None] * len(seqs)
    try:
        for idx in _batches_by_budget([len(s) for s in seqs], budget):
            ids, mask = right_pad([seqs[i] for i in idx], pad_id)
            logits = forward_logits(model, ids.to(device), mask.to(device), precision)
            if restrictions is not None:
                logits = restricted(logits, [restrictions[i] for i in idx])
            vals = fn(logits, ids.to(device)).cpu()
            for j, i in enumerate(idx):
                out[i] = vals[j, : len(seqs[i])].tolist()
    finally:
        model.train(was)
    return out


def sequence_logprobs(model, seqs: Sequence[Sequence[int]], pad_id: int, budget: int = 16384,
                      precision: str | None = None, temperature: float = 1.0,
                      restrictions: Sequence | None = None) -> list[list[float]]:
    """Per token of each sequence, its log-prob given the prefix (entry 0 is 0.0), under
    the model's distribution at ``temperature`` (restricted where ``restrictions[i]``
    says, see :func:`restricted`)."""
    return _per_sequence(model, seqs, pad_id, budget, precision,
                         lambda logits, ids: token_logprobs(tempered(logits, temperature), ids),
                         restrictions)


def sequence_entropies(model, seqs: Sequence[Sequence[int]], pad_id: int, budget: int = 16384,
                       precision: str | None = None, temperature: float = 1.0,
                       restrictions: Sequence | None = None) -> list[list[float]]:
    """Per token of each sequence, the entropy of the distribution that produced it, the
    model's at ``temperature`` (restricted where ``restrictions[i]`` says; entry 0 is 0.0)."""
    return _per_sequence(model, seqs, pad_id, budget, precision,
                         lambda logits, ids: token_entropies(tempered(logits, temperature)),
                         restrictions)


# ------------------------------------------------------------------------ KV cache
def _innermost(model):
    while isinstance(model, WrapsBaseModel):  # peft / reference wrappers pass kwargs through
        inner = model.get_base_model()
        if inner is model:
            break
        model = inner
    return model


def cache_kwarg(model) -> str:
    """The forward keyword of the KV cache: transformers 5 says ``cache``, 4.x said
    ``past_key_values``."""
    params = inspect.signature(type(_innermost(model)).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_of(output):
    """The KV cache a cached forward returned (either transformers naming)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def growing_cache(model):
    """A DynamicCache whose layers grow by capacity doubling instead of ``torch.cat``
    on every token (which makes decoding O(L^2) in copies).  ``None`` (let the model
    build its own) where the cache internals differ (other transformers versions)."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
        cache = DynamicCache(config=model.config)
        layers = getattr(cache, "layers", None)
        if not layers or any(type(x) is not DynamicLayer for x in layers):
            return cache
        for layer in layers:
            layer.__class__ = _growing_layer_class(DynamicLayer)
        return cache
    except Exception:  # pragma: no cover - depends on the installed transformers
        return None


_GROWING: dict = {}


def _growing_layer_class(base):
    if base in _GROWING:
        return _GROWING[base]

    class GrowingLayer(base):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self._kb = self._vb = None
                self._n = 0
            n = self._n + key_states.shape[-2]
            if self._kb is None or n > self._kb.shape[-2]:
                cap = max(n, 2 * (self._kb.shape[-2] if self._kb is not None else 128))
                kb = key_states.new_empty(key_states.shape[:-2] + (cap, key_states.shape[-1]))
                vb = value_states.new_empty(value_states.shape[:-2] + (cap, value_states.shape[-1]))
                if self._kb is not None:
                    kb[..., : self._n, :] = self._kb[..., : self._n, :]
                    vb[..., : self._n, :] = self._vb[..., : self._n, :]
                self._kb, self._vb = kb, vb
            self._kb[..., self._n:n, :] = key_states
            self._vb[..., self._n:n, :] = value_states
            self._n = n
            self.keys = self._kb[..., :n, :]
            self.values = self._vb[..., :n, :]
            return self.keys, self.values

    _GROWING[base] = GrowingLayer
    return GrowingLayer
