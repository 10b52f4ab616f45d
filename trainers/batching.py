"""Trajectories + credit -> padded per-token tensors.

Per-turn advantages are broadcast onto that turn's response tokens; prompt and
observation tokens get loss mask 0.  Sequences are packed into micro-batches by
a token budget (padded rows x width), longest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..agents.constraints import Restriction, sequence_restriction
from ..types import CreditAssignment, Trajectory, TrajectoryGroup


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L] float, 1 on trained response tokens
    advantages: torch.Tensor  # [B, L]
    old_logprobs: torch.Tensor  # [B, L] behaviour log-probs (0 off-mask)
    # per row, its constrained tokens' allowed ids (agents.numerics.restricted)
    restrictions: tuple[Restriction, ...] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def to(self, device) -> "SequenceBatch":
        return SequenceBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                                       self.loss_mask, self.advantages,
                                                       self.old_logprobs)), self.restrictions)


@dataclass(frozen=True)
class TokenRow:
    ids: list[int]
    mask: list[float]
    adv: list[float]
    logprobs: list[float]
    restriction: Restriction = ()  # constrained decoding: what each token was drawn from


def trajectory_rows(traj: Trajectory, turn_adv: Sequence[float],
                    token_adv: Sequence[Sequence[float] | None] | None = None) -> list[TokenRow]:
    """The training rows of one trajectory: one for a full-history episode, one per turn
    in window mode.  Loss mask 0 on prompt/observation tokens, the turn's advantage (or
    its per-token override) on its response tokens."""
    rows = []
    for sq in traj.sequences():
        n = len(sq.ids)
        mask, adv, lps = [0.0] * n, [0.0] * n, [0.0] * n
        for k, (a, b) in zip(sq.turns, sq.spans):
            turn = traj.turns[k]
            override = token_adv[k] if token_adv is not None else None
            if override is not None and len(override) != b - a:
                raise ValueError("token advantage override must match the response length")
            mask[a:b] = [float(m) for m in turn.response_mask]
            adv[a:b] = list(override) if override is not None else [float(turn_adv[k])] * (b - a)
            lps[a:b] = list(turn.logprobs)
        rows.append(TokenRow(list(sq.ids), mask, adv, lps, sequence_restriction(traj, sq)))
    return rows


def rows_from_groups(groups: Sequence[TrajectoryGroup], credits: Sequence[CreditAssignment]
                     ) -> list[TokenRow]:
    rows = []
    for g, c in zip(groups, credits):
        for i, traj in enumerate(g):
            tok = c.token_advantages[i] if c.token_advantages is not None else None
            rows.extend(trajectory_rows(traj, c.turn_advantages[i], tok))
        for traj, adv in c.extra:
            rows.extend(trajectory_rows(traj, adv))
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
    return SequenceBatch(ids, att, mask, adv, old, tuple(r.restriction for r in rows))


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
