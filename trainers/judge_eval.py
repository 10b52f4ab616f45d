"""``turngym judge-eval``: how often does an LLM judge give a segment the oracle's role?

Segments come from rollouts of a policy (a model directory, with a run's config) on
the config's env, from a run's logged groups (``RUN/samples.jsonl``), or from the
env's own noisy expert (``--expert``: every role occurs, which a weak policy may not
give).  Every
segment whose env info carries what the oracle reads (:func:`~turngym.credit.roles.
has_oracle_info`) is labelled by the oracle judge; ``segments`` of them are drawn with
a fixed seed, stratified by oracle role by default (each role gets an equal share,
rare roles all they have, the remainder filled from the others), and sent to the LLM
judge one request each.

Reported (``judge_eval.json`` and a heatmap ``judge_eval.png`` under ``--out``):
agreement with a bootstrap 95% interval, Cohen's kappa (chance-corrected: a judge that
always names one role scores 0) with its interval, the 4x4 confusion matrix (rows:
oracle, columns: judge; the fallback role counts where the judge failed, as in
training), per-role recall and precision, macro recall, the agreement reweighted to
the pool's natural role frequencies, the majority-role baseline, the fallback rate
and its causes (unparseable replies, HTTP and transport failures), and latency per
segment (p50 / p95, retries included).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Sequence

import httpx
import numpy as np

from ..credit.agreement import (agreement, bootstrap_ci, cohen_kappa, confusion_matrix,
                                macro_recall, per_class, reweighted_agreement)
from ..credit.judges import JudgeSpec, openai_judge
from ..credit.llm_judge import OpenAIJudge, Verdict
from ..credit.roles import ROLE_NAMES, Segment, has_oracle_info, oracle_role, segments_of
from ..types import StopReason, TrajectoryGroup
from .checkpoint import write_atomic_text

SAMPLING = ("stratified", "natural")


class JudgeEvalError(ValueError):
    """Input the command cannot use (no segments, no server, a bad samples file)."""


# ------------------------------------------------------------------ segment sources
def groups_from_rollouts(cfg, checkpoint: str, split: str | None, tasks: int, group_size: int,
                         seed: int) -> tuple[list[TrajectoryGroup], dict]:
    """Rollouts of the model in ``checkpoint`` with the config's agent and training
    sampler on ``split`` (default: the train split), tasks ``seed .. seed+tasks-1``."""
    import torch

    from ..agents.factory import load_pretrained
    from ..agents.hf_backend import HFPolicy
    from ..agents.prompting import ChatPrompter
    from ..agents.rollout import EnvPool, rollout
    from .runtime import env_factory, quiet_transformers, rollout_config

    quiet_transformers()
    torch.set_num_threads(max(1, int(cfg.threads)))
    torch.manual_seed(seed)
    model, tok = load_pretrained(checkpoint, cfg.model.dtype, cfg.model.device,
                                 cfg.model.gguf_file)
    policy = HFPolicy(model.eval(), tok, max_batch_size=cfg.agent.max_batch_size,
                      generator_seed=seed)
    split = split or cfg.env.train_split
    groups = rollout(policy, ChatPrompter(tok, cfg.agent.system_prompt),
                     EnvPool(env_factory(cfg, split)), list(range(seed, seed + tasks)),
                     group_size, rollout_config(cfg))
    eps = [t for g in groups for t in g]
    kept = [TrajectoryGroup(tuple(t for t in g if t.stop_reason is not StopReason.ERROR),
                            g.task_id) for g in groups]
    source = {"kind": "rollouts", "checkpoint": str(checkpoint), "env": cfg.env.id,
              "split": split, "tasks": tasks, "group_size": group_size,
              "episodes": len(eps), "success": float(np.mean([t.success for t in eps])),
              "env_error_episodes": sum(t.stop_reason is StopReason.ERROR for t in eps)}
    return [g for g in kept if len(g)], source


def groups_from_expert(cfg, split: str | None, tasks: int, group_size: int, seed: int,
                       epsilon: float | None = None, corrupt: float | None = None
                       ) -> tuple[list[TrajectoryGroup], dict]:
    """Episodes of the env's own expert (:class:`~turngym.envs.base.HasOracle`) with the
    warm start's noise: with probability ``epsilon`` a random admissible action, with
    ``corrupt`` a corrupted expert action (defaults: ``warmstart.epsilon`` /
    ``warmstart.corrupt``).  Every role occurs, which a weak policy may not give."""
    import random

    from ..envs.base import HasOracle
    from ..types import Trajectory, Turn
    from .demos import noisy_expert_action
    from .runtime import env_factory

    eps = float(cfg.warmstart.epsilon if epsilon is None else epsilon)
    cor = float(cfg.warmstart.corrupt if corrupt is None else corrupt)
    split = split or cfg.env.train_split
    env = env_factory(cfg, split)()
    if not isinstance(env.unwrapped, HasOracle):
        raise JudgeEvalError(f"{cfg.env.id} has no expert (HasOracle): roll out a model with "
                             "--checkpoint instead")
    groups, words = [], []
    for task in range(seed, seed + tasks):
        trajs = []
        for k in range(group_size):
            rng = random.Random(f"{seed}/{task}/{k}")
            obs, info0 = env.reset(seed=task)
            info0 = dict(info0, first_observation=obs)
            info, turns, won, total = info0, [], False, 0.0
            for _ in range(int(cfg.agent.max_turns)):
                a = noisy_expert_action(env.unwrapped.oracle_action(), info, words, rng,
                                        eps, cor)
                obs, r, term, trunc, info = env.step(a)
                words.extend(w for w in obs.lower().split()[:50] if len(words) < 5000)
                turns.append(Turn((), (), (), (), a, obs, float(r),
                                  dict(info, valid_format=True)))
                total += float(r)
                won = won or bool(info.get("won"))
                if term or trunc:
                    break
            stop = StopReason.WON if won else (StopReason.ANSWERED if info.get("answered")
                                               else StopReason.MAX_TURNS)
            trajs.append(Trajectory(tuple(turns), total, won, stop, str(info0.get("task_id",
                                                                                   task)),
                                    f"expert-{task}", 0, info0))
        groups.append(TrajectoryGroup(tuple(trajs), trajs[0].task_id))
    env.close()
    eps_all = [t for g in groups for t in g]
    return groups, {"kind": "expert", "env": cfg.env.id, "split": split, "tasks": tasks,
                    "group_size": group_size, "epsilon": eps, "corrupt": cor,
                    "episodes": len(eps_all),
                    "success": float(np.mean([t.success for t in eps_all]))}


def samples_file(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        from .samples import SAMPLES_FILE
        p = p / SAMPLES_FILE
    if not p.is_file():
        raise JudgeEvalError(f"--samples {path}: no samples.jsonl there")
    return p


def groups_from_samples(path: str | Path) -> tuple[list[TrajectoryGroup], dict]:
    """The groups a run logged for ``turngym view`` (token-free, text clipped as logged)."""
    from .samples import read_samples, rebuild_group

    p = samples_file(path)
    records, status = read_samples(p)
    groups = []
    for rec in records:
        try:
            groups.append(rebuild_group(rec))
        except (KeyError, TypeError, ValueError) as exc:
            raise JudgeEvalError(f"{p}: a group record cannot be rebuilt ({exc!r})") from None
    steps = sorted({int(r["step"]) for r in records})
    return groups, {"kind": "samples", "path": str(p), "groups": len(groups),
                    "steps": [steps[0], steps[-1]] if steps else [],
                    "torn_lines": status["torn"]}


def oracle_pool(groups: Sequence[TrajectoryGroup]) -> tuple[list[Segment], list[str], int]:
    """(segments with oracle info, their oracle roles, segments without oracle info)."""
    segs, roles, missing = [], [], 0
    for g in groups:
        for i, tr in enumerate(g):
            for s in segments_of(tr, i):
                if has_oracle_info(s):
                    segs.append(s)
                    roles.append(oracle_role(s).value)
                else:
                    missing += 1
    return segs, roles, missing


def sample_indices(roles: Sequence[str], n: int, seed: int, method: str = "stratified"
                   ) -> list[int]:
    """``n`` indices into ``roles`` (all of them when there are fewer), drawn with
    ``seed``.  ``stratified``: an equal share per role; a role with fewer items gives
    all of them and the rest of its share goes to the others (water-filling).
    ``natural``: uniform without replacement."""
    if method not in SAMPLING:
        raise ValueError(f"sampling must be one of {SAMPLING}, got {method!r}")
    rng = np.random.default_rng([5318, int(seed)])
    m = len(roles)
    if n >= m:
        return list(range(m))
    if method == "natural":
        return sorted(int(i) for i in rng.choice(m, size=n, replace=False))
    by_role = {r: [i for i, x in enumerate(roles) if x == r] for r in ROLE_NAMES}
    take = {r: 0 for r in ROLE_NAMES}
    left = n
    open_roles = [r for r in ROLE_NAMES if by_role[r]]
    while left > 0 and open_roles:
        share = max(1, left // len(open_roles))
        for r in list(open_roles):
            add = min(share, len(by_role[r]) - take[r], left)
            take[r] += add
            left -= add
            if take[r] == len(by_role[r]):
                open_roles.remove(r)
            if left == 0:
                break
    out = []
    for r in ROLE_NAMES:
        if take[r]:
            out.extend(int(i) for i in rng.choice(by_role[r], size=take[r], replace=False))
    return sorted(out)


# ------------------------------------------------------------------ the measurement
def _quantiles(x: Sequence[float]) -> dict:
    a = np.asarray(x, dtype=np.float64)
    if not a.size:
        return {"p50": None, "p95": None, "mean": None, "max": None}
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "mean": float(a.mean()), "max": float(a.max())}


def _counts(labels: Sequence[str]) -> dict:
    return {r: int(sum(x == r for x in labels)) for r in ROLE_NAMES}


def score_labels(oracle: Sequence[str], judged: Sequence[str], weights: Sequence[float] | None
                 = None, n_boot: int = 1000, seed: int = 0) -> dict:
    """Agreement statistics of ``judged`` against ``oracle`` (role names)."""
    c = confusion_matrix(oracle, judged, ROLE_NAMES)
    pos = {r: k for k, r in enumerate(ROLE_NAMES)}
    ci = bootstrap_ci([pos[r] for r in oracle], [pos[r] for r in judged], len(ROLE_NAMES),
                      n_boot, seed)
    rows = c.sum(1)
    major = int(np.argmax(rows)) if rows.sum() else 0
    out = {"n": int(c.sum()), "agreement": agreement(c), "agreement_ci95": ci["agreement"],
           "kappa": cohen_kappa(c), "kappa_ci95": ci["kappa"], "macro_recall": macro_recall(c),
           "confusion": c.tolist(), "per_role": per_class(c, ROLE_NAMES),
           "majority_baseline": {"role": ROLE_NAMES[major],
                                 "agreement": float(rows[major] / rows.sum()) if rows.sum()
                                 else 0.0, "kappa": 0.0}}
    if weights is not None:
        out["agreement_natural"] = reweighted_agreement(c, weights)
    return out


def evaluate_judge(judge: OpenAIJudge, segments: Sequence[Segment], oracle: Sequence[str],
                   weights: Sequence[float] | None = None, workers: int = 1,
                   progress: bool = True, n_boot: int = 1000, seed: int = 0,
                   examples: int = 8) -> dict:
    """The judge's verdicts on ``segments`` scored against the ``oracle`` roles."""
    from tqdm.auto import tqdm

    verdicts: list[Verdict] = []
    bar = tqdm(total=len(segments), desc="judge", leave=False, disable=not progress)
    t0 = time.perf_counter()
    chunk = max(1, int(workers)) * 4
    for k in range(0, len(segments), chunk):
        verdicts.extend(judge.verdicts(segments[k:k + chunk], max_workers=workers))
        bar.update(len(segments[k:k + chunk]))
    wall = time.perf_counter() - t0
    bar.close()
    judged = [(v.role.value if v.role is not None else judge.fallback.value) for v in verdicts]
    failed = [v.role is None for v in verdicts]
    res = score_labels(oracle, judged, weights, n_boot, seed)
    ok = [i for i, f in enumerate(failed) if not f]
    res["parsed_only"] = (score_labels([oracle[i] for i in ok], [judged[i] for i in ok],
                                       weights, n_boot, seed) if ok else None)
    n = max(1, len(verdicts))
    res["judge_counts"] = _counts(judged)
    res["errors"] = {
        "fallback": int(sum(failed)), "fallback_rate": sum(failed) / n,
        "fallback_role": judge.fallback.value,
        "attempts": int(sum(v.attempts for v in verdicts)),
        "parse_failures": int(sum(v.parse_failures for v in verdicts)),
        "parse_failure_rate_per_attempt": (sum(v.parse_failures for v in verdicts)
                                           / max(1, sum(v.attempts for v in verdicts))),
        "http_failures": int(sum(v.http_failures for v in verdicts)),
        "transport_failures": int(sum(v.transport_failures for v in verdicts)),
        "retried_segments": int(sum(v.attempts > 1 for v in verdicts))}
    res["latency_s"] = _quantiles([v.latency_s for v in verdicts])
    res["wall_s"] = wall
    res["workers"] = int(workers)
    res["examples"] = [{"oracle": oracle[i], "judge": judged[i], "fallback": failed[i],
                        "actions": list(segments[i].actions)[-1:],
                        "reply": verdicts[i].reply[:300]} for i in range(min(examples,
                                                                              len(verdicts)))]
    return res


def served_model(base_url: str, timeout: float = 10.0) -> str:
    """The model id the server reports; JudgeEvalError when nothing answers there."""
    url = base_url.rstrip("/") + "/models"
    try:
        r = httpx.get(url, timeout=timeout)
        data = r.json().get("data") or [{}]
        return str(data[0].get("id", "?")) if r.status_code == 200 else f"? (HTTP {r.status_code})"
    except (httpx.HTTPError, ValueError, AttributeError, IndexError) as exc:
        raise JudgeEvalError(f"no OpenAI-compatible server answers at {base_url} ({exc}); "
                             "start one, e.g. turngym serve --model DIR") from None


def run_judge_eval(groups: Sequence[TrajectoryGroup], source: dict, spec: JudgeSpec,
                   segments: int = 200, sampling: str = "stratified", seed: int = 0,
                   workers: int = 1, out_dir: str | Path | None = None, progress: bool = True,
                   command: str = "", n_boot: int = 1000) -> dict:
    """Samples segments from ``groups``, labels them with the oracle and the judge
    ``spec`` describes, and writes ``judge_eval.json`` / ``judge_eval.png``."""
    if segments < 1:
        raise JudgeEvalError(f"--segments must be >= 1, got {segments}")
    pool, pool_roles, missing = oracle_pool(groups)
    if not pool:
        raise JudgeEvalError(f"none of the {missing} segments carries oracle info "
                             f"(progress/state_key in the env's info): nothing to measure "
                             "a judge against")
    idx = sample_indices(pool_roles, segments, seed, sampling)
    segs = [pool[i] for i in idx]
    oracle = [pool_roles[i] for i in idx]
    pool_counts = _counts(pool_roles)
    weights = [pool_counts[r] / len(pool_roles) for r in ROLE_NAMES]
    model_id = served_model(spec.base_url)
    judge = openai_judge(spec)
    try:
        res = evaluate_judge(judge, segs, oracle, weights, workers, progress, n_boot, seed)
    finally:
        judge.close()
    system, template = spec.prompt()
    report = {
        "command": command, "source": source,
        "judge": {"base_url": spec.base_url, "model": spec.model, "served_model": model_id,
                  "temperature": spec.temperature, "max_tokens": spec.max_tokens,
                  "retries": spec.retries, "timeout": spec.timeout, "max_chars": spec.max_chars,
                  "system_prompt": system, "user_template": template,
                  "prompt_sha256": hashlib.sha256((system + "\x00" + template).encode())
                  .hexdigest()[:16]},
        "sampling": {"method": sampling, "seed": seed, "requested": segments,
                     "segments": len(segs), "pool_segments": len(pool),
                     "segments_without_oracle_info": missing,
                     "pool_oracle_counts": pool_counts, "sample_oracle_counts": _counts(oracle)},
        "roles": list(ROLE_NAMES), **res}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic_text(out / "judge_eval.json", json.dumps(report, indent=1))
        try:
            plot_confusion(report, out / "judge_eval.png")
        except Exception as exc:  # a plot must never lose the numbers
            print(f"warning: could not plot the confusion matrix: {exc}")
    return report


# ------------------------------------------------------------------ output
SHORT = {"decisive_progress": "decisive\nprogress", "useful_exploration": "useful\nexploration",
         "no_progress_infrastructure": "no progress /\ninfrastructure",
         "regression": "regression"}


def plot_confusion(report: dict, path: str | Path) -> Path:
    """Heatmap of the confusion matrix: colour = share of the oracle row (recall on the
    diagonal), text = counts."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = np.asarray(report["confusion"], dtype=np.float64)
    rows = c.sum(1, keepdims=True)
    share = np.divide(c, rows, out=np.zeros_like(c), where=rows > 0)
    names = [SHORT.get(r, r) for r in report["roles"]]
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    for i in range(c.shape[0]):
        for j in range(c.shape[1]):
            ax.text(j, i, f"{int(c[i, j])}", ha="center", va="center", fontsize=11,
                    color="white" if share[i, j] > 0.6 else "black")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("LLM judge")
    ax.set_ylabel("oracle")
    src = report.get("source", {})
    where = src.get("env", src.get("path", ""))
    ax.set_title(f"{report['judge'].get('served_model', '')} on {where}\n"
                 f"n={report['n']}, agreement {report['agreement']:.2f}, "
                 f"kappa {report['kappa']:.2f}, fallback {report['errors']['fallback_rate']:.0%}",
                 fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the oracle row")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def format_report(r: dict) -> str:
    lo, hi = r["agreement_ci95"]
    klo, khi = r["kappa_ci95"]
    s = r["sampling"]
    e = r["errors"]
    lat = r["latency_s"]
    head = "oracle \\ judge"
    lines = [f"judge {r['judge']['served_model']} at {r['judge']['base_url']}: "
             f"{r['n']} segments ({s['method']} from a pool of {s['pool_segments']})",
             f"agreement {r['agreement']:.3f} [{lo:.3f}, {hi:.3f}]  kappa {r['kappa']:.3f} "
             f"[{klo:.3f}, {khi:.3f}]  macro recall {r['macro_recall']:.3f}  "
             f"majority baseline {r['majority_baseline']['agreement']:.3f} "
             f"({r['majority_baseline']['role']})",
             f"fallback {e['fallback']} ({e['fallback_rate']:.1%}): {e['parse_failures']} "
             f"unparseable replies, {e['http_failures']} HTTP, {e['transport_failures']} "
             f"transport failures over {e['attempts']} attempts",
             f"latency per segment p50 {lat['p50']:.2f} s, p95 {lat['p95']:.2f} s "
             f"({r['workers']} concurrent)",
             f"{head:<28s}" + "".join(f"{x[:12]:>13s}" for x in r["roles"])
             + f"{'recall':>9s}"]
    for role, row in zip(r["roles"], r["confusion"]):
        rec = r["per_role"][role]["recall"]
        lines.append(f"{role:<28s}" + "".join(f"{v:>13d}" for v in row)
                     + (f"{rec:9.3f}" if rec is not None else f"{'-':>9s}"))
    return "\n".join(lines)
