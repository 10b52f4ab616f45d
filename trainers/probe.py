"""Credit-quality probe: how well does each credit module's per-turn advantage track
the *true* advantage of that turn?

Truth by Monte Carlo: for every turn t of every sampled trajectory, the state the
agent acted in is resumed exactly (env replay + the identical token prefix, see
:mod:`turngym.agents.branching`) and ``continuations`` episodes are sampled from
it with the same policy.  Their mean outcome is V(s_t); the terminal state's value
is the trajectory's own outcome.  The true advantage of turn t's action is
``V(s_{t+1}) - V(s_t)`` (the env is deterministic, so Q(s_t, a_t) = V(s_{t+1})).

Per module (on the same trajectory groups): Spearman rank correlation with the
true advantages over all turns, sign agreement on turns whose true advantage is
clearly non-zero, and the MSE between the two after z-scoring each (scales
differ by design).  Results go to ``probe.json`` and a bar chart ``probe.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from .. import credit as credit_lib
from ..agents.branching import branch_point, continue_from
from ..agents.factory import load_pretrained
from ..agents.hf_backend import HFPolicy
from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, rollout
from ..types import TrajectoryGroup
from .checkpoint import write_atomic_text


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _z(x: np.ndarray) -> np.ndarray:
    s = x.std()
    return (x - x.mean()) / s if s > 0 else np.zeros_like(x)


def agreement(estimate: np.ndarray, truth: np.ndarray, tol: float = 1e-6) -> dict:
    clear = np.abs(truth) > tol
    sign = float((np.sign(estimate[clear]) == np.sign(truth[clear])).mean()) if clear.any() \
        else float("nan")
    return {"spearman": spearman(estimate, truth), "sign_agreement": sign,
            "mse_z": float(np.mean((_z(estimate) - _z(truth)) ** 2)),
            "turns": int(len(truth)), "clear_turns": int(clear.sum())}


def turn_level(c) -> np.ndarray:
    """One number per turn: the turn advantage, or the mean of the turn's token
    advantages where an estimator credits below the turn (branch segments)."""
    out = []
    for i, adv in enumerate(c.turn_advantages):
        toks = c.token_advantages[i] if c.token_advantages is not None else None
        for t, a in enumerate(adv):
            x = toks[t] if toks is not None and toks[t] else None
            out.append(float(np.mean(x)) if x else float(a))
    return np.array(out, dtype=np.float64)


def mc_true_advantages(policy, prompter, pool, groups: Sequence[TrajectoryGroup], rcfg,
                       continuations: int, chunk: int = 256, progress: bool = True
                       ) -> list[list[np.ndarray]]:
    """``out[g][i][t]``: V(s_{t+1}) - V(s_t) for turn t of trajectory i of group g."""
    index, points = [], []
    for gi, g in enumerate(groups):
        for ti, traj in enumerate(g):
            for t in range(traj.num_turns):
                bp = branch_point(traj, t)
                for _ in range(continuations):
                    index.append((gi, ti, t))
                    points.append(bp)
    sums: dict = {}
    bar = tqdm(total=len(points), desc="MC continuations", leave=False, disable=not progress)
    for s in range(0, len(points), chunk):
        for key, tr in zip(index[s:s + chunk],
                           continue_from(policy, prompter, pool, points[s:s + chunk], rcfg)):
            sums[key] = sums.get(key, 0.0) + tr.outcome_reward
        bar.update(len(points[s:s + chunk]))
    bar.close()
    out = []
    for gi, g in enumerate(groups):
        rows = []
        for ti, traj in enumerate(g):
            v = np.array([sums[gi, ti, t] / continuations for t in range(traj.num_turns)]
                         + [traj.outcome_reward])
            rows.append(np.diff(v))
        out.append(rows)
    return out


def run_probe(cfg: DictConfig, checkpoint: str, split: str | None = None, tasks: int = 8,
              group_size: int = 4, continuations: int = 4, estimators: Sequence[str] = (),
              reference: str | None = None, out_dir: str | None = None, seed: int = 0,
              progress: bool = True) -> dict:
    from .pipeline import credit_context, env_factory, quiet_transformers, rollout_config

    quiet_transformers()
    torch.set_num_threads(max(1, cfg.threads))
    model, tok = load_pretrained(checkpoint, cfg.model.dtype, cfg.model.device)
    ref = None
    if reference:
        ref, _ = load_pretrained(reference, cfg.model.dtype, cfg.model.device)
        ref.eval().requires_grad_(False)
    policy = HFPolicy(model, tok, max_batch_size=cfg.agent.max_batch_size,
                      generator_seed=seed)
    prompter = ChatPrompter(tok, cfg.agent.system_prompt)
    split = split or cfg.env.eval_splits[0]
    pool = EnvPool(env_factory(cfg, split))
    rcfg = rollout_config(cfg)
    groups = rollout(policy, prompter, pool, list(range(seed, seed + tasks)), group_size, rcfg)
    truth = mc_true_advantages(policy, prompter, pool, groups, rcfg, continuations,
                               progress=progress)
    flat_truth = np.concatenate([a for g in truth for a in g])
    params = OmegaConf.to_container(cfg.rl.credit.params, resolve=True) or {}
    results: dict = {"split": split, "tasks": tasks, "group_size": group_size,
                     "continuations": continuations, "checkpoint": checkpoint,
                     "success": float(np.mean([t.success for g in groups for t in g])),
                     "true_adv_abs_mean": float(np.abs(flat_truth).mean()), "modules": {},
                     "skipped": {}}
    for name in estimators or credit_lib.list_estimators():
        needs = credit_lib.requirements(name)
        ctx = credit_context(needs, policy, model, ref if ref is not None else model, tok, params,
                             lambda pts: continue_from(policy, prompter, pool, pts, rcfg))
        try:
            credits = credit_lib.assign_credit(name, groups, params, ctx)
        except (KeyError, ValueError) as exc:  # e.g. no gold answer / state keys in this env
            results["skipped"][name] = str(exc)
            continue
        est = np.concatenate([turn_level(c) for c in credits])
        results["modules"][name] = agreement(est, flat_truth)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic_text(out / "probe.json", json.dumps(results, indent=1))
        try:
            plot_probe(results, out / "probe.png")
        except Exception as exc:  # a plot must never lose the numbers
            print(f"warning: could not plot the probe: {exc}")
    return results


def plot_probe(results: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["modules"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 3, 3.6))
    sp = [results["modules"][n]["spearman"] for n in names]
    sg = [results["modules"][n]["sign_agreement"] for n in names]
    ax.bar(x - 0.2, sp, 0.4, label="Spearman with MC advantage")
    ax.bar(x + 0.2, sg, 0.4, label="sign agreement")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, names)
    ax.set_ylim(-1, 1)
    ax.set_title(f"credit quality on {results['split']} ({results['tasks']} tasks x "
                 f"{results['group_size']}, {results['continuations']} MC continuations/state)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_probe(results: dict) -> str:
    lines = [f"probe on {results['split']}: success {results['success']:.3f}, "
             f"mean |true advantage| {results['true_adv_abs_mean']:.3f}",
             f"{'module':<16s} {'spearman':>9s} {'sign agr.':>10s} {'mse (z)':>8s} {'turns':>6s}"]
    for n, m in results["modules"].items():
        lines.append(f"{n:<16s} {m['spearman']:9.3f} {m['sign_agreement']:10.3f} "
                     f"{m['mse_z']:8.3f} {m['turns']:6d}")
    for n, why in results["skipped"].items():
        lines.append(f"{n:<16s} skipped: {why}")
    return "\n".join(lines)
