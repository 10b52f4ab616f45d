"""Supervised warm-start: cross-entropy on response tokens of demonstration rows."""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

import torch

from ..agents.numerics import forward_logits, token_logprobs
from .batching import TokenRow, collate, micro_batches


def sft_train(model, rows: Sequence[TokenRow], epochs: int, lr: float, batch_size: int,
              token_budget: int, pad_id: int, seed: int = 0, weight_decay: float = 0.0,
              warmup_steps: int = 20, grad_clip: float = 1.0,
              on_step: Callable[[int, dict], None] | None = None,
              precision: str | None = None) -> list[dict]:
    if not rows:
        raise ValueError("no demonstration rows to train on")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(rows) / batch_size)
    total = max(1, steps_per_epoch * epochs)

    def schedule(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        frac = (step - warmup_steps) / max(1, total - warmup_steps)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    device = next(model.parameters()).device
    model.train()
    history = []
    step = 0
    for epoch in range(epochs):
        for batch in _length_grouped_batches(rows, batch_size, rng):
            n_tok = sum(sum(r.mask) for r in batch)
            opt.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for mb in micro_batches(batch, token_budget):
                b = collate(mb, pad_id).to(device)
                logits = forward_logits(model, b.input_ids, b.attention_mask, precision)
                lp = token_logprobs(logits, b.input_ids)
                loss = -(lp * b.loss_mask).sum() / max(n_tok, 1.0)
                loss.backward()
                loss_sum += float(loss.item())
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            sched.step()
            rec = {"epoch": epoch, "sft_loss": loss_sum, "grad_norm": float(gn),
                   "lr": sched.get_last_lr()[0]}
            history.append(rec)
            if on_step is not None:
                on_step(step, rec)
            step += 1
    return history


def _length_grouped_batches(rows: Sequence[TokenRow], batch_size: int, rng: random.Random
                            ) -> list[list[TokenRow]]:
    """Batches of similar-length rows (less padding), in random order each epoch."""
    jittered = sorted(rows, key=lambda r: len(r.ids) + rng.random() * 16)
    batches = [list(jittered[i:i + batch_size]) for i in range(0, len(jittered), batch_size)]
    rng.shuffle(batches)
    return batches
