"""One policy-gradient update on a batch of trajectory groups.

Old log-probs are recomputed by the trainer before the update by default
(``recompute_logprobs``), so a mismatch between the sampler's numerics and the
trainer's (vLLM vs transformers, bf16 vs fp32) cannot bias the ratio; the
rollout's sampling log-probs are used otherwise.
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

from ..agents.hf_backend import token_logprobs
from ..types import CreditAssignment, TrajectoryGroup
from .batching import TokenRow, collate, micro_batches, rows_from_groups
from .losses import aggregate, kl_k3, ppo_clip_terms


@torch.no_grad()
def _score_rows(model, rows: Sequence[TokenRow], pad_id: int, budget: int) -> list[list[float]]:
    """Per-token log-probs of each row under ``model`` (in ``rows`` order)."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    out: dict[int, list[float]] = {}
    index = {id(r): i for i, r in enumerate(rows)}
    for mb in micro_batches(rows, budget):
        b = collate(mb, pad_id).to(device)
        lp = token_logprobs(model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits,
                            b.input_ids).cpu()
        for j, r in enumerate(mb):
            out[index[id(r)]] = lp[j, : len(r.ids)].tolist()
    model.train(was)
    return [out[i] for i in range(len(rows))]


class PolicyGradientTrainer:
    def __init__(self, model, optimizer, cfg, pad_id: int, ref_model=None, seed: int = 0):
        self.model = model
        self.opt = optimizer
        self.cfg = cfg
        self.pad_id = pad_id
        self.ref_model = ref_model
        self.rng = random.Random(seed)
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("rl.kl_coef > 0 needs a reference model")

    def update(self, groups: Sequence[TrajectoryGroup], credits: Sequence[CreditAssignment]
               ) -> dict[str, float]:
        cfg = self.cfg
        rows = rows_from_groups(groups, credits)
        rows = [r for r in rows if any(r.mask)]
        if not rows:
            return {"skipped": 1.0}
        if cfg.recompute_logprobs:
            olds = _score_rows(self.model, rows, self.pad_id, cfg.token_budget)
            rows = [TokenRow(r.ids, r.mask, r.adv, o) for r, o in zip(rows, olds)]
        refs = None
        if cfg.kl_coef > 0:
            refs = {id(r): lp for r, lp in
                    zip(rows, _score_rows(self.ref_model, rows, self.pad_id, cfg.token_budget))}
        device = next(self.model.parameters()).device
        self.model.train()
        stats = {"pg_loss": 0.0, "kl": 0.0, "clipfrac": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        n_updates = 0
        for _ in range(cfg.ppo_epochs):
            order = list(rows)
            self.rng.shuffle(order)
            size = max(1, -(-len(order) // max(1, cfg.minibatches)))
            for start in range(0, len(order), size):
                mini = order[start:start + size]
                n_tok = float(sum(sum(r.mask) for r in mini))
                denom = n_tok if cfg.loss_agg == "token_mean" else float(len(mini))
                self.opt.zero_grad(set_to_none=True)
                for mb in micro_batches(mini, cfg.token_budget):
                    b = collate(mb, self.pad_id).to(device)
                    logits = self.model(input_ids=b.input_ids,
                                        attention_mask=b.attention_mask).logits
                    logp = token_logprobs(logits, b.input_ids)
                    pg, clipped = ppo_clip_terms(logp, b.old_logprobs, b.advantages,
                                                 cfg.clip_low, cfg.clip_high)
                    loss = aggregate(pg, b.loss_mask, cfg.loss_agg, denom)
                    if refs is not None:
                        ref = torch.zeros_like(logp)
                        for j, r in enumerate(mb):
                            ref[j, : len(r.ids)] = torch.tensor(refs[id(r)])
                        kl = kl_k3(logp, ref)
                        loss = loss + cfg.kl_coef * aggregate(kl, b.loss_mask, cfg.loss_agg, denom)
                        stats["kl"] += float((kl.detach() * b.loss_mask).sum()) / n_tok
                    loss.backward()
                    with torch.no_grad():
                        stats["pg_loss"] += float(loss.item())
                        stats["clipfrac"] += float((clipped * b.loss_mask).sum()) / n_tok
                        ent = _entropy(logits[:, :-1])
                        stats["entropy"] += float((ent * b.loss_mask[:, 1:]).sum()) / n_tok
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                stats["grad_norm"] += float(gn)
                self.opt.step()
                n_updates += 1
        out = {k: v / max(1, n_updates) for k, v in stats.items()}
        out["train_tokens"] = float(sum(len(r.ids) for r in rows))
        out["response_tokens"] = float(sum(sum(r.mask) for r in rows))
        return out


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits.float(), dim=-1)
    return -(lp.exp() * lp).sum(-1)
