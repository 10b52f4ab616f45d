"""Credit-quality probe: how well does each credit module's per-turn advantage track
the *true* advantage of that turn?

Truth by Monte Carlo: for every turn t of every sampled trajectory, the state the
agent acted in is resumed exactly (env replay + the identical token prefix, see
:mod:`turngym.agents.branching`) and ``continuations`` episodes are sampled from
it with the same policy.  Their mean outcome is V(s_t); the terminal state's value
is the trajectory's own outcome.  The true advantage of turn t's action is
``V(s_{t+1}) - V(s_t)`` (the env is deterministic, so Q(s_t, a_t) = V(s_{t+1})).
Episodes and continuations the env cut off with an error are left out (counted as
``error_episodes`` / ``error_continuations``); a turn none of whose states keeps a
continuation has no truth and is left out of the agreement (``turns_without_truth``).

Per module (on the same trajectory groups): Spearman rank correlation with the
true advantages over all turns, sign agreement on turns whose Monte-Carlo advantage
is not zero (|A| > 1e-6; how many of them exceed twice their standard error is
``clear_turns`` of the probe), and the MSE between the two after z-scoring each
(scales differ by design).  The split-half Spearman r (two disjoint halves of the
continuations) is the reliability of a half-size truth; the noise ceiling, the most an
estimate can agree with the full truth, is sqrt(2r / (1 + r)) (Spearman-Brown).
Results go to ``probe.json`` and a bar chart ``probe.png``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
from ..types import StopReason, TrajectoryGroup
from .checkpoint import write_atomic_text
from .credit import Brancher, credit_context, drop_errored
from .runtime import env_factory, quiet_transformers, rollout_config
from .samples import write_probe_samples


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
    if len(a) == 0:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _z(x: np.ndarray) -> np.ndarray:
    s = x.std()
    return (x - x.mean()) / s if s > 0 else np.zeros_like(x)


def agreement(estimate: np.ndarray, truth: np.ndarray, tol: float = 1e-6) -> dict:
    """Over the turns whose truth is known (NaN: every continuation hit an env error)."""
    known = np.isfinite(truth)
    estimate, truth = estimate[known], truth[known]
    if not known.any():
        return {"spearman": float("nan"), "sign_agreement": float("nan"),
                "mse_z": float("nan"), "turns": 0, "nonzero_turns": 0}
    nonzero = np.abs(truth) > tol  # (the probe's clear_turns count those > 2 SE apart)
    sign = float((np.sign(estimate[nonzero]) == np.sign(truth[nonzero])).mean()) \
        if nonzero.any() else float("nan")
    return {"spearman": spearman(estimate, truth), "sign_agreement": sign,
            "mse_z": float(np.mean((_z(estimate) - _z(truth)) ** 2)),
            "turns": int(len(truth)), "nonzero_turns": int(nonzero.sum())}


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


def _nanmean(o: np.ndarray) -> np.ndarray:
    """Row means over the finite entries (NaN for a row with none), without warnings."""
    n = np.isfinite(o).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.nansum(o, 1) / n, np.nan)


@dataclass
class MCTruth:
    """Monte-Carlo truth per turn: ``outcomes[g][i][t]`` holds the continuation outcomes
    from the state before turn t of trajectory i of group g."""

    outcomes: list[list[np.ndarray]]  # [g][i] -> array [T_i, continuations]; NaN: env error
    final: list[list[float]]  # [g][i]: the trajectory's own outcome (terminal value)

    def values(self, cols: np.ndarray | None = None) -> list[list[np.ndarray]]:
        """V(s_t) per turn (mean over the given continuation columns that the env did not
        cut off with an error; NaN where none is left), then the outcome."""
        return [[np.append(_nanmean(o[:, cols] if cols is not None else o), f)
                 for o, f in zip(og, fg)] for og, fg in zip(self.outcomes, self.final)]

    def advantages(self, cols: np.ndarray | None = None) -> list[list[np.ndarray]]:
        """A_t = V(s_{t+1}) - V(s_t) per turn."""
        return [[np.diff(v) for v in vg] for vg in self.values(cols)]

    def errors(self) -> int:
        """Continuations the env cut off with an error (left out of every value)."""
        return int(sum(np.isnan(o).sum() for og in self.outcomes for o in og))

    def standard_errors(self) -> list[list[np.ndarray]]:
        """SE of each A_t: V estimates from independent continuations, so the variances
        add (the terminal value is exact)."""
        out = []
        for og in self.outcomes:
            rows = []
            for o in og:
                c = np.isfinite(o).sum(1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    sd = np.sqrt(np.nansum((o - _nanmean(o)[:, None]) ** 2, 1) / (c - 1))
                se_v = np.append(np.where(c > 1, sd / np.sqrt(np.maximum(c, 1)), np.nan), 0.0)
                rows.append(np.sqrt(se_v[:-1] ** 2 + se_v[1:] ** 2))
            out.append(rows)
        return out


def mc_truth(policy, prompter, pool, groups: Sequence[TrajectoryGroup], rcfg,
             continuations: int, chunk: int = 256, progress: bool = True) -> MCTruth:
    """``continuations`` episodes resumed (exact prefix) from the state before every turn."""
    index, points = [], []
    for gi, g in enumerate(groups):
        for ti, traj in enumerate(g):
            for t in range(traj.num_turns):
                bp = branch_point(traj, t)
                for c in range(continuations):
                    index.append((gi, ti, t, c))
                    points.append(bp)
    outcomes = [[np.zeros((traj.num_turns, continuations)) for traj in g] for g in groups]
    bar = tqdm(total=len(points), desc="MC continuations", leave=False, disable=not progress)
    for s in range(0, len(points), chunk):
        for (gi, ti, t, c), tr in zip(index[s:s + chunk],
                                      continue_from(policy, prompter, pool, points[s:s + chunk],
                                                    rcfg)):
            outcomes[gi][ti][t, c] = (np.nan if tr.stop_reason is StopReason.ERROR
                                      else tr.outcome_reward)
        bar.update(len(points[s:s + chunk]))
    bar.close()
    return MCTruth(outcomes, [[t.outcome_reward for t in g] for g in groups])


def mc_true_advantages(policy, prompter, pool, groups, rcfg, continuations: int,
                       chunk: int = 256, progress: bool = True) -> list[list[np.ndarray]]:
    """``out[g][i][t]``: V(s_{t+1}) - V(s_t) for turn t of trajectory i of group g."""
    return mc_truth(policy, prompter, pool, groups, rcfg, continuations, chunk,
                    progress).advantages()


def _flat(rows: list[list[np.ndarray]]) -> np.ndarray:
    return np.concatenate([a for g in rows for a in g]) if rows else np.zeros(0)


def bootstrap_agreement(estimates: list[list[np.ndarray]], truth: MCTruth, n_boot: int = 1000,
                        seed: int = 0) -> dict:
    """Point estimates plus 95% CIs of Spearman and sign agreement under a two-level
    bootstrap: task groups resampled with replacement, and each state's continuations
    resampled (the MC noise of the truth is part of the interval)."""
    rng = np.random.default_rng(seed)
    point = agreement(_flat(estimates), _flat(truth.advantages()))
    G = len(estimates)
    c = truth.outcomes[0][0].shape[1] if G and truth.outcomes[0] else 1
    sp, sg = [], []
    for _ in range(n_boot):
        gs = rng.integers(0, G, size=G)
        cols = rng.integers(0, c, size=c)
        adv = truth.advantages(cols)
        e = np.concatenate([a for g in gs for a in estimates[g]])
        t = np.concatenate([a for g in gs for a in adv[g]])
        m = agreement(e, t)
        sp.append(m["spearman"])
        sg.append(m["sign_agreement"])
    # a replicate without a turn that has a truth (or a clear one) has no statistic
    point["spearman_ci95"] = _percentile_ci(sp)
    point["sign_agreement_ci95"] = _percentile_ci(sg)
    point["boot_replicates_without_truth"] = int(np.sum(~np.isfinite(sp)))
    return point


def _percentile_ci(xs) -> list[float]:
    x = np.asarray(xs, dtype=np.float64)
    x = x[np.isfinite(x)]
    return ([float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))] if x.size
            else [float("nan"), float("nan")])


def split_half_ceiling(truth: MCTruth) -> float:
    """Spearman r between the truths from two disjoint halves of the continuations: the
    reliability of a half-size truth (see :func:`noise_ceiling` for what an estimate can
    reach against the full truth)."""
    c = truth.outcomes[0][0].shape[1] if truth.outcomes and truth.outcomes[0] else 0
    if c < 2:
        return float("nan")
    a = _flat(truth.advantages(np.arange(0, c // 2)))
    b = _flat(truth.advantages(np.arange(c // 2, c)))
    both = np.isfinite(a) & np.isfinite(b)
    return spearman(a[both], b[both])


def noise_ceiling(split_half: float) -> float:
    """The most a perfect estimate can agree with the full-size MC truth, from the
    split-half reliability r: the full truth's reliability is 2r / (1 + r)
    (Spearman-Brown), and an estimate of the true values correlates with it at most by
    its square root."""
    if not np.isfinite(split_half):
        return float("nan")
    r = max(float(split_half), 0.0)
    return float(np.sqrt(2 * r / (1 + r)))


def per_turn_estimates(credits, groups) -> list[list[np.ndarray]]:
    out = []
    for c, g in zip(credits, groups):
        flat = turn_level(c)
        rows, k = [], 0
        for traj in g:
            rows.append(flat[k:k + traj.num_turns])
            k += traj.num_turns
        out.append(rows)
    return out


def run_probe(cfg: DictConfig, checkpoint: str, split: str | None = None, tasks: int = 8,
              group_size: int = 4, continuations: int = 4, estimators: Sequence[str] = (),
              reference: str | None = None, out_dir: str | None = None, seed: int = 0,
              progress: bool = True, n_boot: int = 1000, command: str = "") -> dict:
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
    groups, error_episodes = drop_errored(groups)  # as training does: never scored
    if not groups:
        raise RuntimeError(f"probe: all {tasks * group_size} rollouts ended in an env error "
                           "(see the env's logs); nothing to measure")
    truth = mc_truth(policy, prompter, pool, groups, rcfg, continuations, progress=progress)
    flat_truth = _flat(truth.advantages())
    known = np.isfinite(flat_truth)  # a state all of whose continuations hit an env error
    se = _flat(truth.standard_errors())
    given = OmegaConf.to_container(cfg.rl.credit.params, resolve=True) or {}
    results: dict = {"command": command, "split": split, "tasks": tasks,
                     "group_size": group_size, "continuations": continuations,
                     "checkpoint": str(checkpoint), "turns": int(flat_truth.size),
                     "success": float(np.mean([t.success for g in groups for t in g])),
                     "error_episodes": error_episodes,
                     "error_continuations": truth.errors(),
                     "turns_without_truth": int((~known).sum()),
                     "true_adv_abs_mean": float(np.abs(flat_truth[known]).mean())
                     if known.any() else float("nan"),
                     "true_adv_se_mean": float(np.nanmean(se)) if np.isfinite(se).any()
                     else float("nan"),
                     "clear_turns": int((np.abs(flat_truth[known])
                                         > 2 * np.nan_to_num(se[known])).sum()),
                     "split_half_spearman": split_half_ceiling(truth),
                     "n_boot": n_boot, "modules": {}, "skipped": {}}
    brancher = Brancher(policy, prompter, pool, rcfg)
    logged: dict = {}  # name -> credits, for probe_samples.jsonl (turngym view)
    for name in estimators or credit_lib.list_estimators():
        # the config's params apply to the estimator it names; the others use defaults
        params = credit_lib.make_params(name, given if name == cfg.rl.credit.name else {})
        try:
            ctx = credit_context(name, params, policy, model,
                                 ref if ref is not None else model, tok, brancher)
            credits = credit_lib.assign_credit(name, groups, params, ctx)
        except (KeyError, ValueError) as exc:  # e.g. no gold answer / state keys in this env
            results["skipped"][name] = str(exc)
            continue
        logged[name] = credits
        est = per_turn_estimates(credits, groups)
        results["modules"][name] = bootstrap_agreement(est, truth, n_boot, seed)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic_text(out / "probe.json", json.dumps(results, indent=1))
        write_probe_samples(out, groups, logged, truth.advantages(), tok,
                            standard_errors=truth.standard_errors())
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
    mods = results["modules"]
    sp = np.array([mods[n]["spearman"] for n in names])
    sg = np.array([mods[n]["sign_agreement"] for n in names])

    def err(key, mid):
        lo = np.array([mods[n].get(key, [m, m])[0] for n, m in zip(names, mid)])
        hi = np.array([mods[n].get(key, [m, m])[1] for n, m in zip(names, mid)])
        return np.vstack([mid - lo, hi - mid]).clip(min=0)
    ax.bar(x - 0.2, sp, 0.4, yerr=err("spearman_ci95", sp), capsize=3,
           label="Spearman with MC advantage (95% CI)")
    ax.bar(x + 0.2, sg, 0.4, yerr=err("sign_agreement_ci95", sg), capsize=3,
           label="sign agreement (95% CI)")
    ceiling = noise_ceiling(results.get("split_half_spearman", float("nan")))
    if np.isfinite(ceiling):
        ax.axhline(ceiling, color="gray", linestyle="--", linewidth=0.8,
                   label="noise ceiling, sqrt(2r/(1+r)) of the MC split-half r")
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
             f"{results['turns']} turns, mean |true advantage| "
             f"{results['true_adv_abs_mean']:.3f} (mean SE {results['true_adv_se_mean']:.3f}), "
             f"split-half Spearman {results['split_half_spearman']:.3f} (noise ceiling "
             f"{noise_ceiling(results['split_half_spearman']):.3f})",
             f"{'module':<16s} {'spearman [95% CI]':>24s} {'sign agr. [95% CI]':>24s} "
             f"{'mse (z)':>8s}"]
    for n, m in results["modules"].items():
        lo, hi = m["spearman_ci95"]
        slo, shi = m["sign_agreement_ci95"]
        lines.append(f"{n:<16s} {m['spearman']:7.3f} [{lo:6.3f},{hi:6.3f}] "
                     f"{m['sign_agreement']:9.3f} [{slo:6.3f},{shi:6.3f}] {m['mse_z']:8.3f}")
    for n, why in results["skipped"].items():
        lines.append(f"{n:<16s} skipped: {why}")
    from .results import errors_note
    note = errors_note(results)
    if note:
        lines.append(note)
    return "\n".join(lines)
