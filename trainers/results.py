"""Results as data: the commands that measure write ``docs/results/*.json``; ``render``
turns them into ``docs/results.md``.  Nothing in the results is typed by hand.

* ``turngym results quickstart --seeds 0,1,2 [overrides]`` -> ``quickstart.json``:
  one full ``turngym train`` per seed (warm start and final success per split, wall
  time), plus each run's learning curve.
* ``turngym results quickstart --variant 'NAME: KEY=VALUE ...' [--variant ...]`` ->
  ``quickstart_variants.json``: the quickstart against whole-recipe variants, paired by
  seed and task (:func:`quickstart_variants`).
* ``turngym compare ... --results compare_<env>.json`` and
  ``turngym probe ... --results probe_<env>.json`` write their own files
  (:func:`compare_record`, :func:`probe_record`).
* ``turngym results render [--dir docs/results] [--out docs/results.md]``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml
from omegaconf import DictConfig, OmegaConf

from ..config import to_dict
from .checkpoint import MANIFEST, write_atomic_text
from .stats import seed_t_interval


def machine() -> dict:
    """Where the numbers were measured (they differ across CPUs for the same seed)."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next((x for x in Path("/proc/cpuinfo").read_text().splitlines()
                      if x.startswith("flags")), "")
        simd = [f for f in ("avx512f", "avx2") if f" {f}" in flags]
    except OSError:
        simd = []
    return {"cpu": cpu, "simd": simd, "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def _write(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_text(path, json.dumps(record, indent=1))
    return path


# ------------------------------------------------------------------------ quickstart
GREEDY_FILE = "greedy_eval.json"
CHECKPOINTS = ("warmstart", "final")


def greedy_reeval(run_cfg: DictConfig, out: Path, progress: bool = True) -> dict:
    """The run's warm-start and final checkpoints re-evaluated with greedy decoding on
    the same fixed tasks (``eval.sampling.greedy=true``): ``{"warmstart": {split:
    success}, "final": ...}``.  Cached in ``RUN/greedy_eval.json`` (see :func:`reeval`)."""
    return reeval(run_cfg, out, {"greedy": True}, GREEDY_FILE, progress)


def reeval(run_cfg: DictConfig, out: Path, sampling: dict, cache_name: str,
           progress: bool = True) -> dict:
    """The run's warm-start and final checkpoints re-evaluated on the same fixed tasks with
    ``eval.sampling`` overridden by ``sampling``: ``{"warmstart": {split: success},
    "final": ...}``.  Cached in ``RUN/cache_name`` with what it measured (each
    checkpoint's manifest digest and the eval config); a resumed run's new ``final/`` or
    another evaluation is measured again, never read from a stale cache."""
    rec = _reeval_record(run_cfg, out, sampling, cache_name, progress)
    return {c: rec[c] for c in CHECKPOINTS}


def _reeval_record(run_cfg: DictConfig, out: Path, sampling: dict, cache_name: str,
                   progress: bool, per_task: bool = False) -> dict:
    """The cache record behind :func:`reeval` (with ``per_task`` success lists: a cache
    written before they were kept is measured again only when they are needed)."""
    from .evaluate import evaluate_checkpoint

    cfg = OmegaConf.merge(run_cfg, {"eval": {"sampling": dict(sampling)}})
    measured = {"checkpoints": {c: hashlib.sha256((out / c / MANIFEST).read_bytes()).hexdigest()
                                for c in CHECKPOINTS},
                "eval": to_dict(cfg.eval), "eval_splits": list(cfg.env.eval_splits)}
    cache = out / cache_name
    if cache.exists():
        rec = json.loads(cache.read_text())
        if rec.get("measured") == measured and (not per_task or "per_task" in rec):
            return rec
    rec: dict = {"per_task": {}}
    for ckpt in CHECKPOINTS:
        res = evaluate_checkpoint(cfg, str(out / ckpt), progress=progress)
        rec[ckpt] = {split: m["success"] for split, m in res.items()}
        rec["per_task"][ckpt] = {split: m["per_task_success"] for split, m in res.items()}
    _write(cache, dict(rec, measured=measured))
    return rec


def reeval_summary(run_cfg: DictConfig, out: Path, sampling: dict, cache_name: str,
                   progress: bool = True) -> dict:
    """:func:`reeval` as the part of a run's ``summary.json`` that paired comparisons
    read: ``{"warmstart_eval"|"final_eval": {split: {"success", "per_task_success",
    "episodes"}}}`` (a cache written without per-task results is measured again)."""
    rec = _reeval_record(run_cfg, out, sampling, cache_name, progress, per_task=True)
    k = int(run_cfg.eval.samples_per_task)  # the re-evaluation plays the run's eval tasks
    return {f"{c}_eval": {split: {"success": rec[c][split],
                                  "per_task_success": rec["per_task"][c][split],
                                  "episodes": k * len(rec["per_task"][c][split])}
                          for split in rec[c]}
            for c in CHECKPOINTS}


DECODING_NAME = re.compile(r"[a-z0-9][a-z0-9_.=-]*")


def parse_decoding(spec: str) -> tuple[str, dict]:
    """``'NAME: temperature=0.4 top_p=1.0'`` -> (NAME, sampling overrides); the keys are
    :class:`~turngym.config.SamplingConfig` fields, checked like any config."""
    from ..config import ConfigError, SamplingConfig, sampling_errors

    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not sep or not DECODING_NAME.fullmatch(name) or name == "greedy":
        raise ConfigError(f"--decoding {spec!r}: want 'NAME: KEY=VALUE ...' with NAME of "
                          "[a-z0-9_.=-] (not 'greedy', which is always measured)")
    known = {f.name for f in dataclasses.fields(SamplingConfig)}
    sampling = {}
    for item in rest.split():
        key, eq, value = item.partition("=")
        if not eq or key not in known:
            raise ConfigError(f"--decoding {spec!r}: {item!r} is not KEY=VALUE with KEY one "
                              f"of {sorted(known)}")
        sampling[key] = yaml.safe_load(value)
    if not sampling:
        raise ConfigError(f"--decoding {spec!r} changes nothing")
    errors = sampling_errors(OmegaConf.merge(OmegaConf.structured(SamplingConfig), sampling),
                             "eval.sampling")
    if errors:
        raise ConfigError(f"--decoding {spec!r}: " + "; ".join(errors))
    return name, sampling


def _seed_run(run_cfg: DictConfig, out: Path, progress: bool) -> tuple[dict, float]:
    """(summary, wall seconds) of one full training run in ``out``: trained, resumed, or
    -- when it finished before -- read back, only if it was run with this config."""
    from .compare import check_finished_run
    from .pipeline import train

    if (out / "summary.json").exists():
        check_finished_run(out, run_cfg)
        summary = json.loads((out / "summary.json").read_text())
        return summary, float(summary.get("wall_seconds_this_run", 0.0))
    t0 = time.time()
    summary = train(run_cfg, resume=(out / "config.yaml").exists(), progress=progress)
    return summary, time.time() - t0


def _run_entry(seed: int, summary: dict, wall: float, first_split: str) -> dict:
    return {"seed": int(seed), "wall_s": wall,
            "warmstart": {s: m["success"] for s, m in summary["warmstart_eval"].items()},
            "final": {s: m["success"] for s, m in summary["final_eval"].items()},
            "final_invalid_action_rate": {s: m["invalid_action_rate"]
                                          for s, m in summary["final_eval"].items()},
            "final_mean_turns": {s: m["mean_turns"] for s, m in summary["final_eval"].items()},
            "episodes_per_eval": summary["final_eval"][first_split]["episodes"],
            "tasks_per_eval": len(summary["final_eval"][first_split].get("per_task_success", []))}


def _multi_sample(episodes, tasks) -> bool:
    """Whether an evaluation played its tasks several times each (``eval.samples_per_task``;
    a record without a task count played each once)."""
    return bool(tasks) and tasks != episodes


def _eval_size(episodes, tasks, what: str = "tasks") -> str:
    """'200 fixed tasks', or '16 fixed tasks x 16 episodes each (a task's success is their
    mean)' for an evaluation that played each task several times."""
    if not _multi_sample(episodes, tasks):
        return f"{episodes} fixed {what}"
    return (f"{tasks} fixed {what} x {episodes // tasks} episodes each (a task's success is "
            "their mean)")


def quickstart_seeds(cfg: DictConfig, seeds: Sequence[int], out_json: Path, command: str,
                     runs_root: Path, progress: bool = True, greedy_eval: bool = True,
                     decodings: dict[str, dict] | None = None) -> dict:
    """One full training run per seed; ``quickstart.json`` in the issue's schema, plus
    (``greedy_eval``) each run's warm start and final policy re-evaluated greedily, and
    with each of ``decodings`` (name -> ``eval.sampling`` overrides) under
    ``runs[i]["decodings"][name]``."""
    runs = []
    out_json.parent.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        out = runs_root / f"seed_{seed}"
        run_cfg = OmegaConf.merge(cfg, {"seed": int(seed), "output_dir": str(out)})
        summary, wall = _seed_run(run_cfg, out, progress)
        greedy = greedy_reeval(run_cfg, out, progress) if greedy_eval else None
        runs.append(_run_entry(seed, summary, wall, cfg.env.eval_splits[0]))
        if greedy is not None:
            runs[-1]["greedy"] = greedy
        if decodings:
            runs[-1]["decodings"] = {
                name: dict(reeval(run_cfg, out, sampling, f"reeval_{name}.json", progress),
                           sampling=dict(sampling))
                for name, sampling in decodings.items()}
        curve = out / "learning_curve.png"
        if curve.exists():
            shutil.copy(curve, out_json.parent / f"quickstart_seed{seed}.png")
    record = {"command": command, "machine": machine(), "runs": runs}
    _write(out_json, record)
    return record


# a quickstart variant is a whole other recipe (warm start included), trained and
# evaluated on what every arm shares: the env, its evaluation tasks, the seeds
QUICKSTART_VARIANT_MAY_NOT_CHANGE = ("env", "eval", "output_dir", "seed")
BASELINE_ARM = "baseline"


def _arm_dir(runs_root: Path, arm: str, seed: int) -> Path:
    root = runs_root if arm == BASELINE_ARM else runs_root / "variants" / arm
    return root / f"seed_{seed}"


def quickstart_variants(cfg: DictConfig, variants: dict[str, DictConfig],
                        seeds: Sequence[int], out_json: Path, command: str, runs_root: Path,
                        split: str, progress: bool = True,
                        decodings: dict[str, dict] | None = None) -> dict:
    """The quickstart (arm ``baseline``, runs in ``runs_root/seed_<s>``, as
    :func:`quickstart_seeds` writes them) against whole-recipe variants (more demos, more
    RL steps, ...; runs in ``runs_root/variants/<name>/seed_<s>``), every run a full
    ``turngym train`` alone.  Arms are paired by seed and by evaluation task; the record
    has :func:`compare_record`'s schema for ``split`` (baseline ``baseline``) plus each
    run's wall time, so whether a variant fits the quickstart's budget is read off it.

    ``decodings`` (name -> ``eval.sampling`` overrides): every arm's warm start and final
    policy is also re-evaluated so, on the same tasks, and compared again, under
    ``record["decodings"][name]`` (same schema, plus ``sampling``).  That is how a
    recipe that changes the training sampler is compared with the baseline at the
    decoding it was trained for (a variant may not change ``eval`` itself)."""
    from .compare import check_variants, config_changes_from, summarize_comparison

    check_variants(cfg, variants, QUICKSTART_VARIANT_MAY_NOT_CHANGE,
                   "the env, its evaluation tasks, the seeds", reserved=BASELINE_ARM)
    if split not in cfg.env.eval_splits:
        from ..config import ConfigError
        raise ConfigError(f"split {split!r} is not evaluated (env.eval_splits: "
                          f"{list(cfg.env.eval_splits)})")
    arms = {BASELINE_ARM: cfg, **variants}
    runs: dict = {}
    walls: dict = {}
    run_cfgs = {(name, int(seed)): OmegaConf.merge(arm_cfg, {
                    "seed": int(seed), "output_dir": str(_arm_dir(runs_root, name, seed))})
                for name, arm_cfg in arms.items() for seed in seeds}
    for name in arms:
        for seed in seeds:
            out = _arm_dir(runs_root, name, seed)
            summary, wall = _seed_run(run_cfgs[name, int(seed)], out, progress)
            runs.setdefault(name, {})[int(seed)] = summary
            walls.setdefault(name, []).append(wall)
    results = summarize_comparison(runs, list(arms), list(cfg.env.eval_splits), BASELINE_ARM)
    results["arms"] = {n: config_changes_from(cfg, v) for n, v in arms.items()}
    record = compare_record(results, split, command)
    record["wall_s"] = walls
    for dname, sampling in (decodings or {}).items():
        again: dict = {}
        for name in arms:
            for seed in seeds:
                again.setdefault(name, {})[int(seed)] = reeval_summary(
                    run_cfgs[name, int(seed)], _arm_dir(runs_root, name, seed), sampling,
                    f"reeval_{dname}.json", progress)
        res = summarize_comparison(again, list(arms), list(cfg.env.eval_splits), BASELINE_ARM)
        sub = compare_record(res, split, command)
        record.setdefault("decodings", {})[dname] = {
            "sampling": dict(sampling), "estimators": sub["estimators"],
            f"vs_{BASELINE_ARM}": sub[f"vs_{BASELINE_ARM}"], "all_splits": sub["all_splits"]}
    _write(out_json, record)
    return record


# ------------------------------------------------------------------------ compare / probe
# what the bootstrap of compare records written before the crossed resample drew
OLD_RESAMPLE = "seeds, then tasks separately within each seed"


def compare_record(results: dict, split: str, command: str) -> dict:
    """compare.json -> the issue's schema for one split (final success on ``split``)."""
    st = results["splits"][split]
    # results written before episodes_per_seed was recorded played each task once
    episodes = st.get("episodes_per_seed", st["tasks_per_seed"])
    return {"command": command, "machine": machine(), "split": split,
            "resample": st.get("resample", OLD_RESAMPLE),
            "episodes_per_eval": episodes, "tasks_per_eval": st["tasks_per_seed"],
            "samples_per_task": episodes // st["tasks_per_seed"], "baseline": results["baseline"],
            "estimators": {n: {"seeds": e["seeds"], "final": e["final"], "mean": e["mean"],
                               "ci95": e["ci95"], "warmstart": e["warmstart"]}
                           for n, e in st["estimators"].items()},
            f"vs_{results['baseline']}": st["vs_baseline"],
            **{f"vs_{other}": pairs for other, pairs in st.get("vs", {}).items()},
            "also_vs": list(st.get("vs", {})),
            "arms": results.get("arms", {}), "all_splits": results["splits"]}


def probe_record(results: dict, command: str) -> dict:
    out = dict(results)
    out["command"] = command
    out["machine"] = machine()
    return out


# ------------------------------------------------------------------------ render
def errors_note(results: dict) -> str:
    """What env errors left out of a probe ('' when nothing was)."""
    e, c, t = (results.get(k, 0) for k in ("error_episodes", "error_continuations",
                                           "turns_without_truth"))
    if not (e or c or t):
        return ""
    return (f"Left out for env errors: {e} rollouts, {c} continuations; {t} turns have no "
            "Monte-Carlo truth.")


def _ci(x: Sequence[float]) -> str:
    return f"[{x[0]:.3f}, {x[1]:.3f}]"


def render_quickstart(rec: dict, title: str | None = None) -> list[str]:
    runs = rec["runs"]
    splits = list(runs[0]["final"])
    lines = [f"## {title or 'Quickstart: `turngym train --config quickstart`'}", "",
             f"Command: `{rec['command']}`", "",
             "| seed | " + " | ".join(f"{s} warm start | {s} after RL" for s in splits)
             + " | wall (min) |",
             "|---|" + "---|---|" * len(splits) + "---|"]
    for r in runs:
        cells = [f"{r['warmstart'][s]:.3f} | **{r['final'][s]:.3f}**" for s in splits]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + f" | {r['wall_s'] / 60:.1f} |")
    for name, fn in (("mean", np.mean), ("std", lambda v: np.std(v, ddof=1) if len(v) > 1
                                         else 0.0)):
        cells = [f"{fn([r['warmstart'][s] for r in runs]):.3f} | "
                 f"{fn([r['final'][s] for r in runs]):.3f}" for s in splits]
        lines.append(f"| {name} | " + " | ".join(cells) + " | |")
    eps, tasks = runs[0].get("episodes_per_eval", "?"), runs[0].get("tasks_per_eval")
    lines += ["", f"Episodes per evaluation: {eps} per split "
              f"({_eval_size(eps, tasks) if _multi_sample(eps, tasks) else 'fixed tasks'}, "
              "fixed sampler seed; the same tasks before and after RL).", ""]
    for _, what, got in _extra_decodings(runs):
        lines += [f"The same checkpoints and tasks with {what}:", "",
                  "| seed | " + " | ".join(f"{s} warm start | {s} after RL" for s in splits)
                  + " |", "|---|" + "---|---|" * len(splits)]
        for r, g in zip(runs, got):
            lines.append(f"| {r['seed']} | " + " | ".join(
                f"{g['warmstart'][s]:.3f} | **{g['final'][s]:.3f}**" for s in splits) + " |")
        cells = [f"{np.mean([g['warmstart'][s] for g in got]):.3f} | "
                 f"{np.mean([g['final'][s] for g in got]):.3f}" for s in splits]
        lines += ["| mean | " + " | ".join(cells) + " |", ""]
    return lines


def _extra_decodings(runs: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(label, description, per-run ``{"warmstart": ..., "final": ...}``) of every
    re-evaluation all runs carry: greedy, then each ``--decoding`` by name."""
    out = []
    if all("greedy" in r for r in runs):
        out.append(("greedy", "greedy decoding (`eval.sampling.greedy=true`)",
                    [r["greedy"] for r in runs]))
    for name, first in runs[0].get("decodings", {}).items():
        if all(name in r.get("decodings", {}) for r in runs):
            what = "`eval.sampling` " + " ".join(f"`{k}={v}`"
                                                 for k, v in first["sampling"].items())
            out.append((name, what, [r["decodings"][name] for r in runs]))
    return out


NARROW_NOTE = ("**This record's bootstrap intervals are too narrow**: every seed played the "
               "same tasks, yet tasks were resampled separately per seed, which averages a "
               "task effect shared by the seeds away; the record holds no per-task data to "
               "recompute them. The seed-level t column is unaffected.")


def _crossed(rec: dict) -> bool:
    """Whether a compare record's bootstrap resampled seeds and tasks crossed."""
    return rec.get("resample", OLD_RESAMPLE) != OLD_RESAMPLE


def _t_vs_baseline(rec: dict, name: str, baseline: str | None = None) -> list[float] | None:
    """Student-t interval of ``name``'s per-seed paired differences to the baseline (or to
    the arm ``baseline``)."""
    base = rec["estimators"][baseline or rec["baseline"]]["final"]
    return seed_t_interval(np.subtract(rec["estimators"][name]["final"], base))


def task_breakdown(rec: dict, name: str, baseline: str) -> str:
    """Where a paired difference comes from, task by task (each task's difference averaged
    over seeds): how many tasks are higher and lower, and the largest gains and losses.
    '' for a record without per-task data."""
    ests = rec.get("all_splits", {}).get(rec["split"], {}).get("estimators", {})
    if name not in ests or baseline not in ests or "per_task_success" not in ests[name]:
        return ""
    diff = np.subtract(ests[name]["per_task_success"],
                       ests[baseline]["per_task_success"]).mean(axis=0)  # [tasks]
    order = np.sort(diff)
    return (f"{name} vs {baseline}, per task (mean over seeds): higher on "
            f"{int((diff > 0).sum())} of {len(diff)} tasks, lower on {int((diff < 0).sum())}"
            f"; largest gains {', '.join(f'{x:+.2f}' for x in order[::-1][:3])}, largest "
            f"losses {', '.join(f'{x:+.2f}' for x in order[:3])}.")


def render_compare(rec: dict, title: str) -> list[str]:
    bases = [rec["baseline"], *rec.get("also_vs", [])]
    lines = [f"## {title}", "", f"Command: `{rec['command']}`", "",
             f"Final success on `{rec['split']}`, "
             f"{_eval_size(rec['episodes_per_eval'], rec.get('tasks_per_eval'))} per "
             f"seed, seeds {next(iter(rec['estimators'].values()))['seeds']}; 95% CIs from a "
             f"bootstrap over {rec.get('resample', OLD_RESAMPLE)}, paired across estimators. "
             "The seed-level t columns are Student-t intervals of the per-seed paired "
             "differences (df = seeds - 1): with few seeds the bootstrap understates the "
             "seed-to-seed spread, so read a difference as shown only if this interval "
             "excludes 0 too."
             + ("" if _crossed(rec) else " " + NARROW_NOTE),
             "", "| estimator | warm start | final (per seed) | mean [95% CI] |"
             + "".join(f" vs {b} [95% CI] | vs {b}, seed-level t 95% CI |" for b in bases),
             "|---|---|---|---|" + "---|---|" * len(bases)]
    for name, e in rec["estimators"].items():
        cells = []
        for b in bases:
            d = rec[f"vs_{b}"].get(name)
            t = _t_vs_baseline(rec, name, b) if d else None
            cells += [f"{d['diff_mean']:+.3f} {_ci(d['ci95'])}" if d else "--",
                      _ci(t) if t else "--"]
        lines.append(f"| {name} | {np.mean(e['warmstart']):.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in e['final'])} | "
                     f"**{e['mean']:.3f}** {_ci(e['ci95'])} | " + " | ".join(cells) + " |")
    lines.append("")
    pairs: set[frozenset] = set()  # each pair once (not also its mirror image)
    for b in bases:  # where each difference in the table comes from, task by task
        for name in rec["estimators"]:
            text = ("" if name == b or frozenset((name, b)) in pairs
                    else task_breakdown(rec, name, b))
            pairs.add(frozenset((name, b)))
            lines += [f"* {text}"] if text else []
    return lines + ([""] if lines[-1] else [])


def render_variants(rec: dict, title: str) -> list[str]:
    lines = render_compare(rec, title)
    base = rec["baseline"]
    for dname, d in rec.get("decodings", {}).items():
        what = " ".join(f"`{k}={v}`" for k, v in d["sampling"].items())
        sub = dict(rec, estimators=d["estimators"], also_vs=[],
                   **{f"vs_{base}": d[f"vs_{base}"]})
        full = render_compare(sub, title)
        table = full[next(i for i, line in enumerate(full) if line.startswith("| estimator")):]
        lines += [(f"Re-evaluated with `eval.sampling` {what} (`{dname}`): the same "
                   "checkpoints, tasks and seeds, warm start included; same columns."), ""]
        lines += table
    lines += ["What each arm changes, and each seed's wall time (every run alone on the "
              "machine below):", "", "| arm | changes | wall (min) per seed |", "|---|---|---|"]
    for name, walls in rec["wall_s"].items():
        changes = "; ".join(f"`{c}`" for c in rec["arms"].get(name, [])) or "--"
        lines.append(f"| {name} | {changes} | {', '.join(f'{w / 60:.1f}' for w in walls)} |")
    return lines + [""]


def render_probe(rec: dict, title: str) -> list[str]:
    from .probe import noise_ceiling
    lines = [f"## {title}", "", f"Command: `{rec['command']}`", "",
             f"{rec['tasks']} tasks x {rec['group_size']} rollouts, {rec['continuations']} "
             f"Monte-Carlo continuations per state, {rec['turns']} turns, policy success "
             f"{rec['success']:.3f}; mean |true advantage| {rec['true_adv_abs_mean']:.3f} with "
             f"mean standard error {rec['true_adv_se_mean']:.3f}; {rec['clear_turns']} turns "
             f"with |A| > 2 SE. MC split-half Spearman r {rec['split_half_spearman']:.3f} (the "
             f"reliability of a half-size truth); noise ceiling for an estimate against the "
             f"full truth sqrt(2r/(1+r)) = {noise_ceiling(rec['split_half_spearman']):.3f}. "
             "Sign agreement counts the turns whose MC advantage is not zero.", "",
             "| estimator | Spearman [95% CI] | sign agreement [95% CI] | MSE (z) |",
             "|---|---|---|---|"]
    for name, m in rec["modules"].items():
        lines.append(f"| {name} | {m['spearman']:.3f} {_ci(m['spearman_ci95'])} | "
                     f"{m['sign_agreement']:.3f} {_ci(m['sign_agreement_ci95'])} | "
                     f"{m['mse_z']:.3f} |")
    for name, why in rec.get("skipped", {}).items():
        lines.append(f"| {name} | skipped: {why[:80]} | | |")
    note = errors_note(rec)
    return lines + ([""] + [note] if note else []) + [""]


README_END = "<!-- /results -->"  # closes every generated README block


def quickstart_summary(rec: dict) -> str:
    """Mean +- std over seeds of the quickstart, for the README."""
    runs = rec["runs"]
    seeds = ", ".join(str(r["seed"]) for r in runs)

    def ms(vals):
        sd = np.std(vals, ddof=1) if len(vals) > 1 else 0.0
        return f"{np.mean(vals):.3f} +- {sd:.3f}"
    rows = ["| split | success after warm start | success after RL |", "|---|---|---|"]
    for split in runs[0]["final"]:
        rows.append(f"| {split} | {ms([r['warmstart'][split] for r in runs])} | "
                    f"**{ms([r['final'][split] for r in runs])}** |")
    for label, _, got in _extra_decodings(runs):
        for split in runs[0]["final"]:
            rows.append(f"| {split}, {label} | "
                        f"{ms([g['warmstart'][split] for g in got])} | "
                        f"**{ms([g['final'][split] for g in got])}** |")
    wall = max(r["wall_s"] for r in runs) / 60
    size = _eval_size(runs[0].get("episodes_per_eval", "?"), runs[0].get("tasks_per_eval"),
                      "evaluation tasks")
    return "\n".join([f"Measured on {rec['machine'].get('cpu', 'a CPU')} "
                      f"({rec['machine'].get('cores')} cores), seeds {seeds}, mean +- std over "
                      f"seeds, {size} "
                      f"per split, decoding sampled as configured (rows marked greedy or with a "
                      f"decoding's name: the same checkpoints and tasks, decoded so; see "
                      f"docs/results.md); every run took at most "
                      f"{wall:.1f} min:", ""] + rows + [
        "", "Written by `" + rec["command"] + "`; per-seed numbers, curves and the credit "
        "comparisons are in [docs/results.md](docs/results.md)."])


def update_readme(readme: Path, block: str, body: str) -> bool:
    """Replaces the README's generated block ``<!-- results:BLOCK -->`` ... ``<!-- /results
    -->`` with ``body``; False when it has none."""
    start, end = f"<!-- results:{block} -->", README_END
    head, found, rest = readme.read_text().partition(start)
    if not found or end not in rest:
        return False
    _, tail = rest.split(end, 1)
    write_atomic_text(readme, head + start + "\n" + body + "\n" + end + tail)
    return True


# file -> (kind, title, required); the page follows this order.  Optional records are
# follow-up measurements (another budget, fresh seeds); a missing one is not listed.
RESULT_FILES = {
    "quickstart.json": ("quickstart", None, True),
    # the same writer on seeds that never took part in choosing the recipe; README keeps
    # quickstart.json's seeds 0, 1, 2 (the issue's), this one is shown beside them
    "quickstart_free.json": (
        "quickstart_seeds", "The quickstart before constrained decoding (free generation, "
        "`agent.constrain_actions=false`; Intel Xeon, seeds 0, 1, 2)", False),
    "quickstart_fresh_seeds.json": (
        "quickstart_seeds", "Free generation on fresh seeds (the previous config; seeds never "
        "used to choose it)", False),
    "quickstart_variants.json": (
        "variants", "Quickstart recipes side by side (whole runs, paired by seed and task)",
        False),
    "quickstart_variants_demos.json": (
        "variants", "Quickstart, more demonstrations at the same SFT cost (750 steps)", False),
    "quickstart_variants_sft4.json": (
        "variants", "Quickstart, a 4th SFT epoch (1,000 SFT steps)", False),
    "quickstart_variants_s8.json": (
        "variants", "Quickstart, a 35-turn cap and a 4th layer", False),
    "quickstart_variants_g16.json": (
        "variants", "Quickstart, groups of 16 on 4 tasks per step (same 64 episodes)", False),
    "quickstart_variants_s12.json": (
        "variants", "Quickstart, twice the corrupted demo actions; 15 % renamed demos", False),
    "quickstart_variants_s13.json": (
        "variants", "Quickstart, the held object shown every turn; a DAgger-style roll-in round",
        False),
    "quickstart_variants_s14.json": (
        "variants", "Quickstart, a penalty on turns that revisit a state; a third of the "
        "corrupted demo actions", False),
    "quickstart_variants_s17.json": (
        "variants",
        "Quickstart, RL at sampling temperature 0.7 and 0.5 (compared at T = 1, 0.7 and 0.5)",
        False),
    "quickstart_variants_s18.json": (
        "variants", "Quickstart, constrained action decoding: the agent chooses among the "
        "admissible commands instead of spelling them (adopted)", False),
    "compare_textworld.json": ("compare", "Credit estimators on the text world (free "
                               "generation)", True),
    "compare_textworld_long.json": (
        "compare", "Text world at the quickstart's RL budget (60 steps of 8 x 8; free "
        "generation)", False),
    "compare_textworld_lr.json": (
        "compare", "Text world, RL learning rate at the quickstart's budget (free generation)",
        False),
    "compare_textworld_cons.json": (
        "compare", "Text world under constrained decoding, the quickstart's RL budget "
        "(pre-registered: step_groups vs grpo)", False),
    "compare_textworld_cons_fresh.json": (
        "compare", "Text world under constrained decoding, confirmatory test on fresh seeds "
        "3-7 (pre-registered: step_groups vs grpo)", False),
    "compare_textworld_horizon.json": (
        "compare", "Text world with a longer horizon (7-9 receptacles, 2-5 objects, 40 turns) "
        "under constrained decoding (pre-registered: step_groups vs grpo)", False),
    "compare_textworld_role.json": (
        "compare", "Text world under constrained decoding, role_judge with the oracle judge "
        "(pre-registered: role_judge vs grpo, seeds 0-7, grpo runs of s19/s20 reused)", False),
    "compare_search.json": ("compare", "Credit estimators on search QA", True),
    "compare_search_confirm.json": (
        "compare", "Search QA, confirmatory test on fresh seeds", False),
    "compare_search_rlfix.json": (
        "compare", "Search QA with the text world's RL settings", False),
    "compare_search_pool.json": (
        "compare", "Search QA, learning a fixed pool of 16 training questions (pre-registered: "
        "info_gain and td_log_ratio vs grpo; pool success, not held-out)", False),
    "compare_search_sparse.json": (
        "compare", "Search QA, the same pool from a weak warm start where most groups fail "
        "together (pre-registered: info_gain and td_log_ratio vs grpo; pool success)", False),
    "compare_search_cbpo.json": (
        "compare", "Search QA, the pool of s22 with branch contrast and the oracle role judge "
        "(pre-registered: branch_contrast vs grpo, role_judge secondary; pool success)", False),
    "compare_search_pool32.json": (
        "compare", "Search QA, a pool of 32 questions: branch contrast against grpo and an "
        "episode-matched grpo (pre-registered confirmation of s25; pool success)", False),
    "probe_textworld.json": ("probe", "Credit-quality probe, text world (free generation)",
                             True),
    "probe_search.json": ("probe", "Credit-quality probe, search QA", True),
    "probe_textworld_cons.json": (
        "probe", "Credit-quality probe, text world under constrained decoding", False),
    "probe_search_pool.json": (
        "probe", "Credit-quality probe, search QA on the training pool of s22 (seed 8's grpo "
        "policy)", False),
}


# ------------------------------------------------------------------------ every contrast
ENV_NAMES = {"textworld": "text world", "search": "search QA"}  # compare_<key>*.json


@dataclasses.dataclass(frozen=True)
class Contrast:
    """One estimator against the baseline in one comparison record."""
    record: str  # the record's file name
    env: str  # from the file name: compare_<env>[_...].json
    estimator: str
    seeds: tuple[int, ...]
    diff: float
    ci95: tuple[float, float]  # paired bootstrap (the record's resample)
    t95: tuple[float, float] | None  # Student-t over per-seed paired differences
    crossed: bool = True  # False: an old record whose bootstrap is too narrow (NARROW_NOTE)
    baseline: str = "grpo"  # or a further baseline of the record (``compare --also-vs``)

    @property
    def label(self) -> str:
        return self.estimator if self.baseline == "grpo" else f"{self.estimator} vs {self.baseline}"

    @property
    def intervals(self) -> list[tuple[float, float]]:
        return [self.ci95] + ([self.t95] if self.t95 else [])

    @property
    def verdict(self) -> str:
        """Above (below) 0 only where the bootstrap CI and the seed-level t interval both
        are: with few seeds the bootstrap alone understates the seed-to-seed spread."""
        return ("above 0" if all(lo > 0 for lo, _ in self.intervals) else
                "below 0" if all(hi < 0 for _, hi in self.intervals) else "includes 0")


def contrasts(results_dir: Path) -> list[Contrast]:
    """Every non-baseline estimator of every compare record present, in RESULT_FILES
    order (environment by environment, oldest first), against the record's baseline and
    then against each further baseline it names (``also_vs``, e.g. an episode-matched
    grpo).  Arms that are not registered estimators (recipe variants compared through
    ``turngym compare``) are left out as the compared arm."""
    from ..credit.registry import list_estimators

    estimators = set(list_estimators())
    rows = []
    for name, (kind, _title, _req) in RESULT_FILES.items():
        path = Path(results_dir) / name
        if kind != "compare" or not path.exists():
            continue
        rec = json.loads(path.read_text())
        key = Path(name).stem.split("_")[1]
        env = ENV_NAMES.get(key, key)
        for base in (rec["baseline"], *rec.get("also_vs", [])):
            for est, d in rec[f"vs_{base}"].items():
                # a recipe arm (e.g. another lr) is not a credit method, nor is the
                # record's own baseline against a further one
                if est not in estimators or est == rec["baseline"]:
                    continue
                t = _t_vs_baseline(rec, est, base)
                rows.append(Contrast(name, env, est, tuple(rec["estimators"][est]["seeds"]),
                                     d["diff_mean"], tuple(d["ci95"]),
                                     tuple(t) if t else None, _crossed(rec), base))
    order = list(ENV_NAMES.values())
    return sorted(rows, key=lambda c: order.index(c.env) if c.env in order else len(order))


def plot_contrasts(rows: Sequence[Contrast], png: Path) -> Path:
    """Forest plot: each contrast's paired difference with its bootstrap CI (thick) and
    seed-level t interval (thin), one row each, 0 marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2))
    y = np.arange(len(rows))[::-1]
    envs = sorted({c.env for c in rows})
    for yi, c in zip(y, rows):
        color = f"C{envs.index(c.env)}"
        if c.t95:  # thin: the seed-level t interval
            ax.plot(c.t95, [yi, yi], color=color, lw=1, alpha=0.6)
        ax.plot(c.ci95, [yi, yi], color=color, lw=4, solid_capstyle="butt")
        ax.plot([c.diff], [yi], "o", color="black", ms=4)
    ax.axvline(0.0, color="grey", ls="--", lw=1)
    ax.legend(handles=[plt.Line2D([], [], color=f"C{i}", lw=4, label=e) for i, e in enumerate(envs)],
              fontsize=8, loc="lower right")
    ax.set_yticks(y, [f"{c.label}, {Path(c.record).stem} ({len(c.seeds)} seeds)"
                      for c in rows], fontsize=7)
    ax.set_xlabel("final success, estimator - grpo (or the named baseline), paired")
    ax.set_title("every credit comparison: bootstrap 95% CI (thick), seed-level t (thin)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _by_env(rows: Sequence[Contrast]) -> dict[str, list[Contrast]]:
    """The contrasts of each env, envs in the order they first appear."""
    out: dict[str, list[Contrast]] = {}
    for c in rows:
        out.setdefault(c.env, []).append(c)
    return out


def contrasts_summary(rows: Sequence[Contrast]) -> str:
    """For the README: per env, how many contrasts lie above 0, the one with the highest
    lower bound, and any below 0."""
    def fmt(c: Contrast) -> str:
        t = f", t [{c.t95[0]:+.3f}, {c.t95[1]:+.3f}]" if c.t95 else ""
        return (f"{c.label} {c.diff:+.3f} [{c.ci95[0]:+.3f}, {c.ci95[1]:+.3f}]{t} "
                f"({len(c.seeds)} seeds, `{c.record}`)")
    parts = []
    for env, env_rows in _by_env(rows).items():
        above = [c for c in env_rows if c.verdict == "above 0"]
        below = [c for c in env_rows if c.verdict == "below 0"]
        text = f"{env}: {len(above)} of {len(env_rows)} contrasts above 0"  # both intervals
        text += ("; " + ", ".join(map(fmt, above)) if above else
                 "; the highest lower bound " + fmt(max(
                     env_rows, key=lambda c: min(lo for lo, _ in c.intervals))))
        parts.append(text + ("; below 0: " + ", ".join(map(fmt, below)) if below else ""))
    old = sorted({c.record for c in rows if not c.crossed})
    return ("Every credit comparison recorded, estimator vs grpo (paired final success, "
            "bootstrap 95% CI; above or below 0 only where the seed-level t interval is too; "
            "table and forest plot in [docs/results.md](docs/results.md)): "
            + ". ".join(parts) + "."
            + (f" {len(old)} of the {len({c.record for c in rows})} records predate the "
               "crossed bootstrap (tasks resampled separately per seed, though every seed "
               "plays the same tasks): their bootstrap intervals are too narrow, their t "
               "intervals are not." if old else ""))


def render_contrasts(rows: Sequence[Contrast], png: Path) -> list[str]:
    """The section that answers "does any turn-level estimator beat the baseline?" across
    every comparison record, with the forest plot."""
    if not rows:
        return []
    lines = ["## Every credit comparison at a glance", "",
             "Each row is one estimator against grpo in one comparison below (same warm "
             "start, RL steps, tasks and groups, and evaluation tasks per seed; branch_contrast "
             "samples its branches on top), or against the baseline named in the row (e.g. a "
             "grpo with a larger group, matched in sampled episodes). A win needs the "
             "bootstrap 95% CI of the paired difference and the seed-level t interval both "
             "above 0. Records "
             "marked * predate the crossed bootstrap: their bootstrap intervals are too "
             "narrow (see the record's section), so only their t interval is to be read.", ""]
    for env, env_rows in _by_env(rows).items():
        wins = [c for c in env_rows if c.verdict == "above 0"]
        lines.append(f"* **{env}**: {len(wins)} of {len(env_rows)} contrasts above 0"
                     + (": " + ", ".join(f"{c.label} ({c.record})" for c in wins)
                        if wins else "") + ".")
    lines += ["", "| env | record | estimator | seeds | paired difference [bootstrap 95% CI] | "
              "seed-level t 95% CI | CI |", "|---|---|---|---|---|---|---|"]
    for c in rows:
        lines.append(f"| {c.env} | `{c.record}`{'' if c.crossed else ' *'} | {c.label} | "
                     f"{len(c.seeds)} | "
                     f"{c.diff:+.3f} [{c.ci95[0]:+.3f}, {c.ci95[1]:+.3f}] | "
                     + (f"[{c.t95[0]:+.3f}, {c.t95[1]:+.3f}]" if c.t95 else "--")
                     + f" | {c.verdict} |")
    plot_contrasts(rows, png)
    return lines + ["", f"![{png.stem}](results/{png.name})", ""]


def _plots(paths) -> list[str]:
    return [line for png in paths if png.exists()
            for line in (f"![{png.stem}](results/{png.name})", "")]


def _render_main_quickstart(rec: dict, title, path: Path, readme: Path | None) -> list[str]:
    """The issue's quickstart record: its section, its per-seed curves, and README's."""
    if readme is not None and Path(readme).exists():
        update_readme(Path(readme), "quickstart", quickstart_summary(rec))
    return render_quickstart(rec) + _plots(sorted(path.parent.glob("quickstart_seed*.png")))


# kind (RESULT_FILES) -> (record, title, the record's path, README or None) -> lines
RENDERERS = {
    "quickstart": _render_main_quickstart,
    "quickstart_seeds": lambda rec, title, path, readme: render_quickstart(rec, title),
    "compare": lambda rec, title, path, readme: (render_compare(rec, title)
                                                 + _plots([path.with_suffix(".png")])),
    "variants": lambda rec, title, path, readme: (render_variants(rec, title)
                                                  + _plots([path.with_suffix(".png")])),
    "probe": lambda rec, title, path, readme: render_probe(rec, title),
}


def render(results_dir: Path, out_md: Path, readme: Path | None = None) -> Path:
    """docs/results.md from every results JSON present (missing ones are listed), then
    ``notes.md`` from the same directory (hand-written analysis) when present."""
    results_dir = Path(results_dir)
    parts = ["# Results", "",
             "Every number here is read from `docs/results/*.json`, written by the command "
             "shown above each table; `turngym results render` regenerates this page. "
             "Numbers differ across CPUs for the same seed, so every result is several seeds "
             "with confidence intervals.", ""]
    rows = contrasts(results_dir)
    parts += render_contrasts(rows, results_dir / "credit_contrasts.png")
    if rows and readme is not None and Path(readme).exists():
        update_readme(Path(readme), "contrasts", contrasts_summary(rows))
    machines = set()
    missing = []
    for name, (kind, title, required) in RESULT_FILES.items():
        p = results_dir / name
        if not p.exists():
            if required:
                missing.append(name)
            continue
        rec = json.loads(p.read_text())
        machines.add(json.dumps(rec.get("machine", {}), sort_keys=True))
        parts += RENDERERS[kind](rec, title, results_dir / name, readme)
    if machines:
        parts += ["## Machine", ""]
        for m in sorted(machines):
            d = json.loads(m)
            parts.append(f"* {d.get('cpu')} ({', '.join(d.get('simd', [])) or 'no AVX2'}), "
                         f"{d.get('cores')} cores, torch {d.get('torch')}, "
                         f"Python {d.get('python')}")
        parts.append("")
    if missing:
        parts += ["## Not measured yet", ""] + [f"* `{m}`" for m in missing] + [""]
    notes = results_dir / "notes.md"  # the analysis: what was tried, what the numbers mean
    if notes.exists():
        parts += [notes.read_text().rstrip(), ""]
    write_atomic_text(Path(out_md), "\n".join(parts))
    return Path(out_md)
