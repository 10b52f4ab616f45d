"""One policy-gradient update on a batch of trajectory groups.

Old log-probs are recomputed by the trainer before the update by default
(``recompute_logprobs``), so a mismatch between the sampler's numerics and the
trainer's (vLLM vs transformers, bf16 vs fp32) cannot bias the ratio; the
rollout's sampling log-probs are used otherwise.  When the update is a single
optimizer step (``ppo_epochs=1``, ``minibatches=1``), the weights the old log-probs
must be scored under are the ones the loss's own forward runs on, so that forward's
log-probs, detached, are the recomputed ones and the separate no-grad scoring pass is
skipped (TRL does the same for ``num_iterations=1``; 4.8 -> 4.2 s per quickstart update).
The ratio is then exactly 1 and the clip inactive.  ``reuse_forward_logprobs``
(attribute) turns this off.

The policy being trained is the sampler's distribution: every log-prob (the loss's,
the recomputed old ones, the reference's for the KL, the entropy) is taken from the
logits divided by the rollout's sampling ``temperature``, as verl's actor does.  At
any temperature other than 1 the trainer would otherwise score another distribution
than the one the tokens were drawn from, and the "first ratio is 1" above would hold
only with recomputed log-probs.  Top-p truncation is not applied in the trainer
(it is not differentiable; verl does not either): with ``top_p < 1`` the sampler's
log-probs and the trainer's differ on every truncated step.

Under ``torchrun`` each rank passes its own groups; the loss is normalised by the
global token (or row) count and gradients are summed across ranks before the
clip and the step (see :mod:`.distributed`), so N ranks make the update one rank
would make on the union of their rows.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import replace
from typing import Sequence

import torch
from torch.distributed.tensor import DTensor

from ..agents.numerics import (forward_logits, model_device, restricted, sequence_logprobs,
                               tempered, token_entropies, token_logprobs)
from ..types import CreditAssignment, TrajectoryGroup
from .batching import TokenRow, collate, micro_batches, rows_from_groups
from .distributed import World
from .fsdp import is_sharded, unsharded
from .hardware import memory_report, reset_peak_memory
from .losses import aggregate, kl_k3, ppo_clip_terms

_STATS = ("pg_loss", "loss", "kl", "clipfrac", "entropy")
LOW_PRECISION = (torch.bfloat16, torch.float16)


def score_rows(model, rows: Sequence[TokenRow], pad_id: int, budget: int,
               precision: str | None = None, temperature: float = 1.0) -> list[list[float]]:
    """Per-token log-probs of each row under ``model`` at ``temperature`` (in ``rows``
    order)."""
    return sequence_logprobs(model, [r.ids for r in rows], pad_id, budget, precision,
                             temperature, [r.restriction for r in rows])


def split_even(items: Sequence, parts: int) -> list[list]:
    """Exactly ``parts`` consecutive chunks whose sizes differ by at most one (some may
    be empty), so every rank takes the same number of optimizer steps."""
    q, r = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        n = q + (1 if k < r else 0)
        out.append(list(items[start:start + n]))
        start += n
    return out


class PolicyGradientTrainer:
    def __init__(self, model, optimizer, cfg, pad_id: int, ref_model=None, seed: int = 0,
                 world: World | None = None, precision: str | None = None,
                 temperature: float = 1.0):
        if not temperature > 0:
            raise ValueError(f"the sampling temperature the policy is trained at must be > 0, "
                             f"got {temperature}")
        self.model = model
        self.temperature = float(temperature)
        self.opt = optimizer
        self.cfg = cfg
        self.pad_id = pad_id
        self.ref_model = ref_model
        self.rng = random.Random(seed)
        self.world = world or World.local()
        self.precision = precision
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sharded = is_sharded(model)  # FSDP2: collectives in every forward/backward
        self.reuse_forward_logprobs = True  # see the module docstring
        low = sorted({str(p.dtype) for p in self.params if p.dtype in LOW_PRECISION})
        if low:
            warnings.warn(f"training {low} weights directly: updates smaller than about 1/256 "
                          "of a weight round away. Keep model.dtype=float32 and set "
                          "model.autocast=bfloat16 (or train LoRA adapters, kept in fp32).",
                          stacklevel=2)
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("rl.kl_coef > 0 needs a reference model")

    def update(self, groups: Sequence[TrajectoryGroup], credits: Sequence[CreditAssignment]
               ) -> dict[str, float]:
        """One PPO pass over this rank's groups; every rank must call it once per step."""
        cfg, world = self.cfg, self.world
        rows = [r for r in rows_from_groups(groups, credits) if any(r.mask)]
        n_rows_global = world.all_reduce_sum([len(rows)])[0]
        if n_rows_global == 0:
            return {"skipped": 1.0}
        device = model_device(self.model)
        reset_peak_memory(device)
        # one optimizer step per update: the loss's forward runs on the "old" weights
        single_step = cfg.ppo_epochs == 1 and max(1, cfg.minibatches) == 1
        reuse = bool(cfg.recompute_logprobs and single_step and self.reuse_forward_logprobs)
        if cfg.recompute_logprobs and not reuse:
            with unsharded(self.model):  # a collective when sharded: every rank enters
                olds = score_rows(self.model, rows, self.pad_id, cfg.token_budget,
                                  self.precision, self.temperature) if rows else []
            rows = [replace(r, logprobs=o) for r, o in zip(rows, olds)]
        refs = None
        if cfg.kl_coef > 0:
            refs = {id(r): lp for r, lp in zip(rows, score_rows(
                self.ref_model, rows, self.pad_id, cfg.token_budget, self.precision,
                self.temperature))}
        self.model.train()
        local = dict.fromkeys(_STATS, 0.0)
        grad_norm, n_updates = 0.0, 0
        parts = max(1, cfg.minibatches)
        for _ in range(cfg.ppo_epochs):
            order = list(rows)
            self.rng.shuffle(order)
            for mini in split_even(order, parts):
                n_tok, n_seq = world.all_reduce_sum([sum(sum(r.mask) for r in mini), len(mini)])
                if n_tok == 0:
                    continue  # no rank has a trained token in this mini-batch
                denom = n_tok if cfg.loss_agg == "token_mean" else n_seq
                self.opt.zero_grad(set_to_none=True)
                for mb in self._micro_batches(mini):
                    self._backward(mb, refs, denom, n_tok, local, device, reuse)
                if not self.sharded:  # FSDP reduce-scatters inside backward
                    world.sum_gradients(self.params)
                gn = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
                grad_norm += float(gn.full_tensor() if isinstance(gn, DTensor) else gn)
                self.opt.step()
                n_updates += 1
        totals = world.all_reduce_sum([local[k] for k in _STATS] + [
            sum(len(r.ids) for r in rows), sum(sum(r.mask) for r in rows)])
        out = {k: v / max(1, n_updates) for k, v in zip(_STATS, totals)}
        out["grad_norm"] = grad_norm / max(1, n_updates)
        out["train_tokens"], out["response_tokens"] = totals[-2], totals[-1]
        out.update(memory_report(device))
        return out

    def _micro_batches(self, rows) -> list[list[TokenRow]]:
        """Token-budget micro-batches; sharded, every rank runs as many as the busiest
        one (the extra ones are a zero-weight padding row)."""
        mbs = micro_batches(rows, self.cfg.token_budget) if rows else []
        if self.sharded:
            pad = TokenRow([self.pad_id] * 2, [0.0] * 2, [0.0] * 2, [0.0] * 2)
            mbs += [[pad]] * (self.world.all_reduce_max(len(mbs)) - len(mbs))
        return mbs

    def _backward(self, mb, refs, denom: float, n_tok: float, stats: dict, device,
                  old_from_forward: bool = False) -> None:
        """Loss of one micro-batch (normalised by the global ``denom``) and its backward;
        ``old_from_forward``: this forward's own log-probs, detached, are the old ones."""
        cfg = self.cfg
        b = collate(mb, self.pad_id).to(device)
        logits = restricted(tempered(forward_logits(self.model, b.input_ids, b.attention_mask,
                                                    self.precision), self.temperature),
                            b.restrictions)
        logp = token_logprobs(logits, b.input_ids)
        old = logp.detach() if old_from_forward else b.old_logprobs
        pg, clipped = ppo_clip_terms(logp, old, b.advantages, cfg.clip_low, cfg.clip_high)
        loss = aggregate(pg, b.loss_mask, cfg.loss_agg, denom)
        stats["pg_loss"] += float(loss.detach())  # the policy-gradient term alone
        ent_coef = float(cfg.entropy_coef)
        ent = token_entropies(logits) if ent_coef else None
        if ent is not None:  # entropy bonus: keeps a sharpening policy exploring
            loss = loss - ent_coef * aggregate(ent, b.loss_mask, cfg.loss_agg, denom)
        if refs is not None:
            ref = torch.zeros_like(logp)
            for j, r in enumerate(mb):
                if id(r) in refs:  # padding rows have no reference (and mask 0)
                    ref[j, : len(r.ids)] = torch.tensor(refs[id(r)])
            kl = kl_k3(logp, ref)
            loss = loss + cfg.kl_coef * aggregate(kl, b.loss_mask, cfg.loss_agg, denom)
            stats["kl"] += float((kl.detach() * b.loss_mask).sum()) / n_tok
        loss.backward()
        with torch.no_grad():
            stats["loss"] += float(loss.detach())  # what was differentiated
            stats["clipfrac"] += float((clipped * b.loss_mask).sum()) / n_tok
            ent = token_entropies(logits) if ent is None else ent.detach()
            stats["entropy"] += float((ent * b.loss_mask).sum()) / n_tok

