"""Branch contrast (CBPO): outcome rewards only; credit comes from re-sampling the
rollout at its most uncertain tokens and seeing whether the outcome changes.

1. **Screening.** The policy's entropy at every *agent* token (response tokens;
   observation tokens are never candidates) ranks branch positions anywhere in a
   response; the ``entropy_topk`` highest of each trajectory are candidates.
2. **Budget with decays.** ``budget`` nodes per group are picked greedily by
   ``entropy * path_decay^(nodes already on that trajectory) *
   node_decay^(nodes within node_window tokens)``: more nodes on one trajectory
   cost more, and nodes do not cluster on adjacent tokens.
3. **Exact-prefix groups.** At each node the env is replayed to the state of that
   turn and ``branches_per_node`` continuations are sampled from the *identical*
   token prefix (the interrupted response included).  Parent + branches form the
   node's group with outcome rewards R.
4. **Contrastive Branch Value.** ``CBV = std(R)`` (``cbv``: std | range | mad).
   Continuation advantages ``a_k = (R_k - mean R) / (std R + eps)`` are rescaled by
   ``w = CBV / mean CBV`` over the group's contrastive nodes: w >= 0, so the sign
   of every advantage is kept; high-contrast decisions weigh more.
5. **Segments.** Nodes split the parent's response tokens into non-overlapping
   segments: tokens before the first node keep the outcome GRPO advantage, tokens
   from node m to node m+1 get node m's ``a_parent * w_m`` (or GRPO's where node m
   showed no contrast).  Branch continuations are returned as extra training
   trajectories; their shared prefix is prompt to them (loss mask 0), so no token
   gets a duplicated gradient.

Services (``requires``): ``policy`` (entropies; ``.model``) and ``brancher``
(``points -> continuation trajectories``, built by the trainer over the env pool).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..agents.branching import branch_point_at
from ..types import CreditAssignment, TrajectoryGroup
from .grpo import group_normalize
from .registry import CreditContext, register_estimator
from .scoring import response_entropies


def select_nodes(entropies: list[np.ndarray], spans: list[list[tuple[int, int]]], budget: int,
                 topk: int, path_decay: float, node_decay: float, window: int
                 ) -> list[tuple[int, int]]:
    """Greedy budgeted choice of (trajectory, token position) branch nodes."""
    cands = []
    for i, (ent, sp) in enumerate(zip(entropies, spans)):
        pos = np.concatenate([np.arange(s, e) for s, e in sp]) if sp else np.zeros(0, int)
        if pos.size == 0:
            continue
        top = pos[np.argsort(-ent[pos], kind="stable")[:topk]]
        cands.extend((i, int(q), float(ent[q])) for q in top)
    chosen: list[tuple[int, int]] = []
    per_traj: dict[int, list[int]] = {}
    for _ in range(budget):
        best, best_score = None, 0.0
        for i, q, h in cands:
            mine = per_traj.get(i, [])
            if q in mine:
                continue
            near = sum(abs(q - p) <= window for p in mine)
            score = h * path_decay ** len(mine) * node_decay ** near
            if score > best_score:
                best, best_score = (i, q), score
        if best is None:
            break
        chosen.append(best)
        per_traj.setdefault(best[0], []).append(best[1])
    return chosen


def contrast_value(r: np.ndarray, how: str) -> float:
    if how == "std":
        return float(r.std())
    if how == "range":
        return float(r.max() - r.min())
    if how == "mad":
        return float(np.abs(r - r.mean()).mean())
    raise ValueError(f"cbv must be std, range or mad; got {how!r}")


@register_estimator("branch_contrast", requires=("policy", "brancher"))
def branch_contrast(group: TrajectoryGroup, cfg: Mapping[str, Any],
                    ctx: CreditContext | None = None) -> CreditAssignment:
    ctx = ctx or CreditContext()
    policy = ctx.need("policy", "branch_contrast")
    brancher = ctx.need("brancher", "branch_contrast")
    trajs = list(group)
    eps = float(cfg.get("eps", 1e-6))
    grpo = group_normalize(np.array(group.outcome_rewards()),
                           bool(cfg.get("std_normalize", True)), eps)
    spans = [t.response_spans() for t in trajs]
    ents = response_entropies(policy.model, trajs, getattr(policy, "pad_id", 0),
                              precision=getattr(policy, "precision", None))
    nodes = select_nodes(ents, spans, int(cfg.get("budget", 8)), int(cfg.get("entropy_topk", 16)),
                         float(cfg.get("path_decay", 0.5)), float(cfg.get("node_decay", 0.5)),
                         int(cfg.get("node_window", 4)))
    k = int(cfg.get("branches_per_node", 2))
    points = [branch_point_at(trajs[i], q) for i, q in nodes for _ in range(k)]
    branches = brancher(points) if points else []
    how = cfg.get("cbv", "std")
    node_adv, node_cbv, branch_adv = [], [], []
    for n, (i, q) in enumerate(nodes):
        r = np.array([trajs[i].outcome_reward] + [b.outcome_reward
                                                  for b in branches[n * k:(n + 1) * k]])
        sd = r.std()
        a = (r - r.mean()) / (sd + eps) if sd > 0 else np.zeros_like(r)
        node_adv.append(a)
        node_cbv.append(contrast_value(r, how))
    cbv = np.array(node_cbv)
    mean_cbv = cbv[cbv > 0].mean() if (cbv > 0).any() else 1.0
    weights = cbv / mean_cbv
    # token advantages of the parents: segments between consecutive nodes
    token_adv = []
    for i, tr in enumerate(trajs):
        L = len(tr.token_ids())
        per_pos = np.full(L, grpo[i])
        mine = sorted((q, n) for n, (j, q) in enumerate(nodes) if j == i)
        for m, (q, n) in enumerate(mine):
            end = mine[m + 1][0] if m + 1 < len(mine) else L
            if node_cbv[n] > 0:
                per_pos[q:end] = node_adv[n][0] * weights[n]
        token_adv.append(tuple(tuple(float(x) for x in per_pos[s:e]) for s, e in spans[i]))
    extra = []
    for n in range(len(nodes)):
        for b_idx, b in enumerate(branches[n * k:(n + 1) * k]):
            adv = float(node_adv[n][1 + b_idx] * weights[n])
            branch_adv.append(adv)
            extra.append((b, tuple([adv] * b.num_turns)))
    turn_adv = tuple(tuple([float(grpo[i])] * t.num_turns) for i, t in enumerate(trajs))
    metrics = {"nodes": float(len(nodes)), "branches": float(len(branches)),
               "contrastive_node_frac": float((cbv > 0).mean()) if cbv.size else 0.0,
               "cbv_mean": float(cbv.mean()) if cbv.size else 0.0,
               "branch_reward_mean": float(np.mean([b.outcome_reward for b in branches]))
               if branches else 0.0,
               "reward_mean": float(np.mean(group.outcome_rewards()))}
    return CreditAssignment(turn_adv, tuple(token_adv), metrics, tuple(extra))
