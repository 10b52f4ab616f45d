"""Trajectories + credit -> padded per-token tensors.

Per-turn advantages are broadcast onto that turn's response tokens; prompt and
observation tokens get loss mask 0.  Sequences are packed into micro-batches by
a token budget (padded rows x width), longest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..types import CreditAssignment, Trajectory, TrajectoryGroup


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L] float, 1 on trained response tokens
    advantages: torch.Tensor  # [B, L]
    old_logprobs: torch.Tensor  # [B, L] behaviour log-probs (0 off-mask)

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def to(self, device) -> "SequenceBatch":
        return SequenceBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                                       self.loss_mask, self.advantages,
                                                       self.old_logprobs)))


@dataclass(frozen=True)
class TokenRow:
    ids: list[int]
    mask: list[float]
    adv: list[float]
    logprobs: list[float]


def trajectory_rows(traj: Trajectory, turn_adv: Sequence[float],
                    token_adv: Sequence[Sequence[float] | None] | None = None) -> TokenRow:
    ids: list[int] = []
    mask: list[float] = []
    adv: list[float] = []
    lps: list[float] = []
    for k, (turn, a) in enumerate(zip(traj.turns, turn_adv)):
        n_p, n_r = len(turn.prompt_ids), len(turn.response_ids)
        ids += turn.prompt_ids
        ids += turn.response_ids
        mask += [0.0] * n_p + [float(m) for m in turn.response_mask]
        override = token_adv[k] if token_adv is not None else None
        if override is not None and len(override) != n_r:
            raise ValueError("token advantage override must match the response length")
        adv += [0.0] * n_p + (list(override) if override is not None else [float(a)] * n_r)
        lps += [0.0] * n_p + list(turn.logprobs)
    return TokenRow(ids, mask, adv, lps)


def rows_from_groups(groups: Sequence[TrajectoryGroup], credits: Sequence[CreditAssignment]
                     ) -> list[TokenRow]:
    rows = []
    for g, c in zip(groups, credits):
        for i, traj in enumerate(g):
            tok = c.token_advantages[i] if c.token_advantages is not None else None
            rows.append(trajectory_rows(traj, c.turn_advantages[i], tok))
        rows.extend(trajectory_rows(traj, adv) for traj, adv in c.extra)
    return rows


def collate(rows: Sequence[TokenRow], pad_id: int) -> SequenceBatch:
    width = max(len(r.ids) for r in rows)
    B = len(rows)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    att = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width))
    adv = torch.zeros((B, width))
    old = torch.zeros((B, width))
    for i, r in enumerate(rows):
        n = len(r.ids)
        ids[i, :n] = torch.tensor(r.ids)
        att[i, :n] = 1
        mask[i, :n] = torch.tensor(r.mask)
        adv[i, :n] = torch.tensor(r.adv)
        old[i, :n] = torch.tensor(r.logprobs)
    return SequenceBatch(ids, att, mask, adv, old)


def micro_batches(rows: Sequence[TokenRow], token_budget: int) -> list[list[TokenRow]]:
    """Packs rows (longest first) so that rows x max_len <= token_budget per micro-batch."""
    order = sorted(rows, key=lambda r: len(r.ids), reverse=True)
    out: list[list[TokenRow]] = []
    cur: list[TokenRow] = []
    for r in order:
        width = len(cur[0].ids) if cur else len(r.ids)
        if cur and (len(cur) + 1) * width > token_budget:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out
