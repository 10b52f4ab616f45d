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
   node's group with outcome rewards R (continuations the env cut off with an error
   are left out).
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

import enum
from dataclasses import dataclass

import numpy as np

from ..agents.branching import branch_point_at
from ..agents.policy import HasModel
from ..types import CreditAssignment, StopReason, TrajectoryGroup
from .grpo import group_normalize
from .registry import CreditContext, register_estimator
from .scoring import response_entropies


def select_nodes(entropies: list[list[np.ndarray]], budget: int, topk: int, path_decay: float,
                 node_decay: float, window: int) -> list[tuple[int, int, int]]:
    """Greedy budgeted choice of (trajectory, turn, response offset) branch nodes.

    ``entropies[i][t]`` holds the entropy of each response token of turn t.  Distances
    for ``node_decay`` count response tokens of the trajectory (observation tokens in
    between do not count), the same in either context mode."""
    cands = []  # (traj, turn, offset, agent-token position, entropy)
    for i, per_turn in enumerate(entropies):
        pos = [(t, o) for t, e in enumerate(per_turn) for o in range(len(e))]
        if not pos:
            continue
        flat = np.concatenate([np.asarray(e, dtype=np.float64) for e in per_turn])
        for q in np.argsort(-flat, kind="stable")[:topk]:
            t, o = pos[int(q)]
            cands.append((i, t, o, int(q), float(flat[q])))
    if not cands:
        return []
    traj = np.array([c[0] for c in cands])
    q = np.array([c[3] for c in cands])
    h = np.array([c[4] for c in cands])
    on_traj = np.zeros(len(entropies), dtype=np.int64)  # nodes chosen per trajectory
    near = np.zeros(len(cands), dtype=np.int64)  # chosen nodes within the window
    taken = np.zeros(len(cands), dtype=bool)
    chosen: list[tuple[int, int, int]] = []
    for _ in range(budget):  # one vectorised scoring pass per pick
        score = h * path_decay ** on_traj[traj] * node_decay ** near
        score[taken | ~np.isfinite(score)] = -np.inf  # a NaN entropy is never a node
        c = int(np.argmax(score))  # the first best, as candidates are ordered
        if not score[c] > 0:
            break
        i, t, o, qc, _ = cands[c]
        chosen.append((i, t, o))
        taken[c] = True
        on_traj[i] += 1
        near += (traj == i) & (np.abs(q - qc) <= window)
    return chosen


class CBV(str, enum.Enum):
    std = "std"
    range = "range"
    mad = "mad"


@dataclass(frozen=True)
class BranchContrastParams:
    budget: int = 8  # branch nodes per group
    entropy_topk: int = 16  # candidates per trajectory
    path_decay: float = 0.5
    node_decay: float = 0.5
    node_window: int = 4  # response tokens
    branches_per_node: int = 2
    cbv: CBV = CBV.std
    std_normalize: bool = True
    eps: float = 1e-6

    def check(self) -> None:
        if self.budget < 0 or self.entropy_topk < 1 or self.branches_per_node < 1:
            raise ValueError("branch_contrast: budget >= 0, entropy_topk >= 1 and "
                             "branches_per_node >= 1 are required")


_CONTRAST = {
    CBV.std: lambda r: float(r.std()),
    CBV.range: lambda r: float(r.max() - r.min()),
    CBV.mad: lambda r: float(np.abs(r - r.mean()).mean()),
}


def contrast_value(r: np.ndarray, how: CBV | str) -> float:
    """How much a node's outcomes differ (``how`` is a :class:`CBV` or its name)."""
    return _CONTRAST[CBV(how)](r)


@register_estimator("branch_contrast", params=BranchContrastParams,
                    requires=("policy", "brancher"))
def branch_contrast(group: TrajectoryGroup, p: BranchContrastParams,
                    ctx: CreditContext | None = None) -> CreditAssignment:
    ctx = ctx or CreditContext()
    policy = ctx.need("policy", "branch_contrast")
    brancher = ctx.need("brancher", "branch_contrast")
    trajs = list(group)
    eps = p.eps
    grpo = group_normalize(np.array(group.outcome_rewards()), p.std_normalize, eps)
    pol = policy if isinstance(policy, HasModel) else None
    if pol is None:  # the trainer hands estimators an HFPolicy over its own model
        raise ValueError("branch_contrast needs a policy with the trainer's model (HasModel) "
                         "to read entropies")
    ents = response_entropies(pol.model, trajs, pol.pad_id, precision=pol.precision,
                              temperature=ctx.sampling_temperature)
    nodes = select_nodes(ents, p.budget, p.entropy_topk, p.path_decay, p.node_decay,
                         p.node_window)
    k = p.branches_per_node
    points = [branch_point_at(trajs[i], t, o) for i, t, o in nodes for _ in range(k)]
    sampled = brancher(points) if points else []
    # a continuation the env cut off with an error says nothing about the decision:
    # it is neither scored nor trained on (as errored rollouts are dropped before credit)
    node_branches = [[b for b in sampled[n * k:(n + 1) * k]
                      if b.stop_reason is not StopReason.ERROR] for n in range(len(nodes))]
    branches = [b for bs in node_branches for b in bs]
    how = CBV(p.cbv)
    node_adv, node_cbv, branch_adv = [], [], []
    for n, (i, _, _) in enumerate(nodes):
        r = np.array([trajs[i].outcome_reward] + [b.outcome_reward for b in node_branches[n]])
        # normalised as the outcome part of the same trajectory is (ddof, std_normalize)
        node_adv.append(group_normalize(r, p.std_normalize, eps))
        node_cbv.append(contrast_value(r, how))
    cbv = np.array(node_cbv)
    mean_cbv = cbv[cbv > 0].mean() if (cbv > 0).any() else 1.0
    weights = cbv / mean_cbv
    # token advantages of the parents: segments between consecutive nodes, in the order
    # of the trajectory's response tokens
    token_adv = []
    for i, tr in enumerate(trajs):
        lens = [len(x.response_ids) for x in tr.turns]
        starts = np.concatenate([[0], np.cumsum(lens)]).astype(int)
        per_tok = np.full(int(starts[-1]), grpo[i])
        mine = sorted((int(starts[t]) + o, n) for n, (j, t, o) in enumerate(nodes) if j == i)
        for m, (q, n) in enumerate(mine):
            end = mine[m + 1][0] if m + 1 < len(mine) else len(per_tok)
            if node_cbv[n] > 0:
                per_tok[q:end] = node_adv[n][0] * weights[n]
        token_adv.append(tuple(tuple(float(x) for x in per_tok[a:b])
                               for a, b in zip(starts[:-1], starts[1:])))
    extra = []
    for n in range(len(nodes)):
        for b_idx, b in enumerate(node_branches[n]):
            adv = float(node_adv[n][1 + b_idx] * weights[n])
            branch_adv.append(adv)
            extra.append((b, tuple([adv] * b.num_turns)))
    turn_adv = tuple(tuple([float(grpo[i])] * t.num_turns) for i, t in enumerate(trajs))
    metrics = {"nodes": float(len(nodes)), "branches": float(len(branches)),
               "error_branches": float(len(sampled) - len(branches)),
               "contrastive_node_frac": float((cbv > 0).mean()) if cbv.size else 0.0,
               "cbv_mean": float(cbv.mean()) if cbv.size else 0.0,
               "branch_reward_mean": float(np.mean([b.outcome_reward for b in branches]))
               if branches else 0.0,
               "reward_mean": float(np.mean(group.outcome_rewards()))}
    return CreditAssignment(turn_adv, tuple(token_adv), metrics, tuple(extra))
