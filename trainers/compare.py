"""Credit-estimator comparison with statistics.

For every seed: ONE warm start (SFT once, evaluated once), then the same RL run --
same budget (steps, tasks per step, group size), same task streams and sampler seeds
-- with each estimator, all starting from that warm start.  Final evaluation uses
fixed task sets (``eval.num_tasks`` per split, identical for every estimator), so
estimators are compared *paired*: on the same tasks, from the same warm start.

Statistics (``paired_bootstrap``): a bootstrap that resamples seeds and, independently,
the evaluation tasks (one task resample for every seed and estimator, since all of them
play the same tasks): it carries both the seed-to-seed variance of RL and the
finite-sample noise of the evaluation.
Each estimator gets the mean final success over seeds and its 95% CI; each
estimator other than the baseline gets the paired difference to the baseline
(``grpo``) with its 95% CI.  Seeds are given up front (``--seeds``), never chosen
after the fact.

Layout (``output_dir``)::

    seed_<s>/shared/warmstart/     the seed's warm start (+ warmstart_eval.json)
    seed_<s>/<estimator>/          a full training run (metrics.jsonl, summary.json, ...)
    compare.json                   per estimator: seeds, finals, mean, ci95; vs baseline
    compare.png                    learning curves (mean over seeds, band = min..max)
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..config import to_dict
from .checkpoint import CheckpointError, verify_manifest, write_atomic_text
from .distributed import World
from .evaluate import evaluate_splits
from .metrics import MetricsLogger, read_metrics
from .runtime import quiet_transformers, seed_everything
from .stats import seed_t_interval


def _with(cfg: DictConfig, **dot) -> DictConfig:
    cfg = OmegaConf.merge(cfg, {})
    for k, v in dot.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return cfg


# what a warm start depends on: a run whose config agrees on these (env.eval_splits
# aside) built the same one
WARM_START_KEYS = ("seed", "env", "model", "agent", "warmstart", "plugins")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def warm_start_differences(saved: dict, mine: dict) -> list[str]:
    """``key: old -> new`` for every key the warm start depends on
    (:data:`WARM_START_KEYS`, except ``env.eval_splits``, which only says what is
    evaluated)."""
    from .run import config_changes

    saved, mine = dict(saved), dict(mine)
    for d in (saved, mine):
        if isinstance(d.get("env"), dict):
            d["env"] = {k: v for k, v in d["env"].items() if k != "eval_splits"}
    diffs = []
    for key in WARM_START_KEYS:
        allowed, refused = config_changes({key: saved.get(key)}, {key: mine.get(key)})
        diffs += refused + allowed  # a resume may change plugins; a warm start's may not
    return diffs


def _eval_spec(cfg: dict) -> dict:
    """What a warm start's evaluation depends on beyond the model: the tasks and the
    decoding."""
    return {"eval": cfg.get("eval"), "eval_splits": cfg.get("env", {}).get("eval_splits")}


def adopt_warm_start(cfg: DictConfig, source_run: Path, shared: Path) -> None:
    """Copies ``source_run/warmstart`` (a verified checkpoint) into ``shared`` after
    checking that the run's saved config agrees with ``cfg`` on every key the warm start
    depends on (:data:`WARM_START_KEYS`, except ``env.eval_splits``); anything else
    refuses with the differences."""
    from ..config import ConfigError

    ws = source_run / "warmstart"
    saved_yaml = source_run / "config.yaml"
    if not saved_yaml.exists():
        raise ConfigError(f"--warm-starts: {source_run} holds no run (no config.yaml)")
    try:
        verify_manifest(ws)
    except CheckpointError as exc:
        raise ConfigError(f"--warm-starts: {ws} does not verify: {exc}") from None
    diffs = warm_start_differences(to_dict(OmegaConf.load(saved_yaml)), to_dict(cfg))
    if diffs:
        raise ConfigError(f"--warm-starts: {source_run} was warm-started with another "
                          "config:\n  " + "\n  ".join(diffs))
    tmp = shared.with_name(shared.name + ".adopting")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    shutil.copytree(ws, tmp / "warmstart")
    (tmp / "adopted_from.txt").write_text(str(source_run.resolve()) + "\n")
    # recorded before the rename: an adopted warm start is never without its config
    write_atomic_text(tmp / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))
    tmp.rename(shared)


def shared_warm_start(cfg: DictConfig, root: Path, progress: bool = True,
                      source_run: Path | None = None) -> tuple[Path, dict]:
    """The seed's warm start (built once, or adopted from ``source_run``; reused when it
    verifies and ``shared/config.yaml`` agrees on what it depends on) and its evaluation
    (reused only if made with this config's evaluation settings)."""
    from ..agents.factory import load_pretrained
    from ..config import ConfigError
    from .warmstart import run_warmstart

    shared = root / "shared"
    ws = shared / "warmstart"
    ev = shared / "warmstart_eval.json"
    spec = shared / "config.yaml"  # the config the warm start was built and evaluated with
    mine = to_dict(cfg)
    legacy = False
    try:
        verify_manifest(ws)
        if spec.exists():
            saved = to_dict(OmegaConf.load(spec))
            diffs = warm_start_differences(saved, mine)
            if diffs:
                raise ConfigError(
                    f"{ws} was built with another config:\n  " + "\n  ".join(diffs)
                    + "\n  use another output_dir to compare with these settings")
            fresh_eval = _eval_spec(saved) == _eval_spec(mine)
        else:  # made by a turngym that did not record it: reused as before, unchecked
            print(f"warning: {shared} has no config.yaml (an older layout); its warm start "
                  "and its evaluation are reused unchecked", flush=True)
            legacy, fresh_eval = True, True
        if ev.exists() and fresh_eval:
            return ws, json.loads(ev.read_text())
    except CheckpointError:
        if shared.exists():
            shutil.rmtree(shared)
        if source_run is not None:
            adopt_warm_start(cfg, source_run, shared)
    shared.mkdir(parents=True, exist_ok=True)
    # the old evaluation goes before the config that no longer describes it is replaced,
    # and the config is written before the warm start is built: a run killed at any point
    # leaves no stale evaluation and no unrecorded warm start
    ev.unlink(missing_ok=True)
    if not legacy:
        write_atomic_text(spec, OmegaConf.to_yaml(OmegaConf.create(mine)))
    quiet_transformers()
    torch.set_num_threads(max(1, cfg.threads))
    seed_everything(cfg.seed)
    log = MetricsLogger(shared / "metrics.jsonl")
    if not (ws / "config.json").exists():
        run_warmstart(cfg, shared, log, progress)
    model, tok = load_pretrained(str(ws), cfg.model.dtype, cfg.model.device)
    res = evaluate_splits(model, tok, cfg, World.local(), log, 0, progress, label="warm start")
    log.close()
    write_atomic_text(ev, json.dumps(res, indent=1))
    return ws, res


def check_finished_run(out: Path, run_cfg: DictConfig) -> None:
    """A finished run is reused, and a started one resumed, only if it was trained and
    evaluated with this config (logging, checkpoint and thread settings aside): a rerun
    with another budget or evaluation must not mix them across estimators."""
    from ..config import ConfigError
    from .run import config_changes

    saved = to_dict(OmegaConf.load(out / "config.yaml"))
    allowed, refused = config_changes(saved, to_dict(run_cfg))
    # the budget and the evaluation are what is compared: neither may differ
    refused += [x for x in allowed if x.startswith(("rl.steps:", "eval."))]
    if refused:
        raise ConfigError(f"{out} was run with another config:\n  " + "\n  ".join(refused)
                          + "\n  use another output_dir (or delete that run) to compare "
                          "with these settings")


def credit_variant(cfg: DictConfig, name: str) -> DictConfig:
    """``cfg`` with estimator ``name`` (its params reset unless it is the config's own)."""
    run_cfg = _with(cfg, **{"rl.credit.name": name})
    if name != cfg.rl.credit.name:
        OmegaConf.update(run_cfg, "rl.credit.params", {}, merge=False)
    return run_cfg


# a variant may change how RL trains, never what the arms share: the warm start and the
# evaluation tasks (``seed`` and ``output_dir`` are set per run by the comparison)
VARIANT_MAY_NOT_CHANGE = (*WARM_START_KEYS, "eval", "output_dir")


def check_variants(cfg: DictConfig, variants: Mapping[str, DictConfig],
                   may_not_change: Sequence[str] = VARIANT_MAY_NOT_CHANGE,
                   shared: str = "the warm start, the evaluation tasks",
                   reserved: str = "shared") -> None:
    """Refuses variants that could not be compared paired (by default: another warm start
    or other evaluation tasks; ``may_not_change`` names the top-level keys every arm
    shares), and names that cannot be run directories (or are ``reserved``)."""
    from ..config import ConfigError
    from .run import config_changes

    if not variants:
        raise ConfigError("a comparison needs at least one estimator or variant")
    base = to_dict(cfg)
    for name, vcfg in variants.items():
        if not _NAME.fullmatch(name) or name == reserved:
            raise ConfigError(f"variant name {name!r}: use letters, digits, '.', '_' or '-' "
                              f"(and not {reserved!r})")
        mine = to_dict(vcfg)
        diffs = []
        for key in may_not_change:
            allowed, refused = config_changes({key: base.get(key)}, {key: mine.get(key)})
            diffs += allowed + refused  # what a resume may change, a variant still may not
        if diffs:
            raise ConfigError(f"variant {name!r} changes what every arm must share ({shared})"
                              ":\n  " + "\n  ".join(diffs))


def compare_credits(cfg: DictConfig, credits: Sequence[str], seeds: Sequence[int] = (0,),
                    progress: bool = True, baseline: str = "grpo", command: str = "",
                    warm_starts: str | Path | None = None) -> dict:
    """One arm per estimator; see :func:`compare_variants`."""
    return compare_variants(cfg, {name: credit_variant(cfg, name) for name in credits},
                            seeds, progress, baseline, command, warm_starts)


def compare_variants(cfg: DictConfig, variants: Mapping[str, DictConfig],
                     seeds: Sequence[int] = (0,), progress: bool = True,
                     baseline: str | None = None, command: str = "",
                     warm_starts: str | Path | None = None,
                     also_vs: Sequence[str] = ()) -> dict:
    """One RL run per (seed, arm), every arm of a seed from that seed's warm start and
    evaluated on the same tasks.  An arm is a named config: an estimator
    (:func:`credit_variant`) or any other override of how RL trains (``rl.lr``, ...).
    ``baseline`` (default: the first arm) is what the others are paired against;
    ``also_vs``: further arms each paired against too (e.g. a compute-matched baseline).
    ``warm_starts``: a directory of earlier runs (``seed_<s>/``, as ``turngym results
    quickstart --runs`` writes them) whose warm starts are adopted instead of rebuilt."""
    from ..config import ConfigError
    from .pipeline import train

    check_variants(cfg, variants)
    names = list(variants)
    baseline = names[0] if baseline is None else baseline
    for arm, flag in ((baseline, "--baseline"), *((a, "--also-vs") for a in also_vs)):
        if arm not in variants:
            raise ConfigError(f"{flag} {arm!r} is not one of the arms: {', '.join(names)}")
    if baseline in also_vs:
        raise ConfigError(f"--also-vs {baseline!r} is the baseline already")
    root = Path(cfg.output_dir)
    # every arm already started here must have this budget and evaluation -- checked
    # before any work, and for unfinished arms too: a resumed arm keeps the warm-start
    # evaluation its run began with
    for seed in seeds:
        for name, vcfg in variants.items():
            out = root / f"seed_{seed}" / name
            if (out / "config.yaml").exists():
                check_finished_run(out, _with(vcfg, seed=int(seed), output_dir=str(out)))
    runs: dict = {}
    for seed in seeds:
        sroot = root / f"seed_{seed}"
        source = Path(warm_starts) / f"seed_{seed}" if warm_starts else None
        ws, ws_eval = shared_warm_start(
            _with(cfg, seed=int(seed), output_dir=str(sroot / "shared")), sroot, progress,
            source)
        for name, vcfg in variants.items():
            out = sroot / name
            run_cfg = _with(vcfg, seed=int(seed), output_dir=str(out))
            if not (out / "summary.json").exists():
                started = (out / "config.yaml").exists()
                train(run_cfg, resume=started, progress=progress, warm_start=ws,
                      warm_start_eval=ws_eval)
            summary = json.loads((out / "summary.json").read_text())
            runs.setdefault(name, {})[int(seed)] = summary
    results = summarize_comparison(runs, names, list(cfg.env.eval_splits), baseline, also_vs)
    results["command"] = command
    results["config"] = to_dict(cfg)
    results["arms"] = {n: config_changes_from(cfg, v) for n, v in variants.items()}
    write_atomic_text(root / "compare.json", json.dumps(results, indent=1))
    try:
        plot_comparison(root, names, seeds, root / "compare.png")
    except Exception as exc:  # the numbers matter more than the picture
        print(f"warning: could not plot the comparison: {exc}")
    return results


def config_changes_from(cfg: DictConfig, variant: DictConfig) -> list[str]:
    """What an arm changes with respect to the comparison's config (``key: old -> new``)."""
    from .run import config_changes
    allowed, refused = config_changes(to_dict(cfg), to_dict(variant))
    return allowed + refused


# ------------------------------------------------------------------------ statistics
# what one bootstrap replicate draws; records without this key resampled tasks separately
# per seed (too narrow where tasks are shared across seeds)
RESAMPLE = "seeds and tasks crossed (one task resample shared by all seeds)"


def _row_counts(idx: np.ndarray, n: int) -> np.ndarray:
    """How often each of 0..n-1 occurs in each row of ``idx`` ([B, k] -> [B, n])."""
    flat = (idx + n * np.arange(len(idx))[:, None]).ravel()
    return np.bincount(flat, minlength=n * len(idx)).reshape(len(idx), n).astype(np.float64)


def paired_bootstrap(per_seed: dict[str, list[np.ndarray]], baseline: str | None,
                     n_boot: int = 10000, seed: int = 0, also_vs: Sequence[str] = ()) -> dict:
    """``per_seed[name][k]``: per-task successes of estimator ``name`` on seed k, task j the
    same task on every seed and for every estimator (the evaluation's fixed task set).
    Returns means, 95% CIs and paired differences to ``baseline`` (``vs_baseline``) and to
    each arm of ``also_vs`` (``vs[name]``, e.g. a compute-matched baseline), all from the
    same replicates.

    Seeds and tasks are crossed, so each replicate draws seeds and tasks independently and
    uses ONE task resample for all its seeds: a task that favours one estimator favours it
    on every seed, and resampling tasks separately per seed would average that shared task
    effect away (intervals too narrow by up to sqrt(seeds) in its part of the variance)."""
    names = list(per_seed)
    S = len(per_seed[names[0]])
    shapes = {n: [len(x) for x in v] for n, v in per_seed.items()}
    T = shapes[names[0]][0] if S else 0
    if any(lens != [T] * S for lens in shapes.values()):  # unpaired data: never truncate
        raise ValueError(f"paired data needs every arm on the same seeds and tasks; tasks "
                         f"per seed: {shapes}")
    data = np.stack([np.stack([np.asarray(x, dtype=np.float64) for x in per_seed[n]])
                     for n in names])  # [E, S, T]
    rng = np.random.default_rng(seed)
    s_idx = rng.integers(0, S, size=(n_boot, S))
    t_idx = rng.integers(0, T, size=(n_boot, T))
    # as counts: replicate b's mean is sum_{s,t} cs[b,s] ct[b,t] data[e,s,t] / (S T)
    cs = _row_counts(s_idx, S)  # [B, S]
    ct = _row_counts(t_idx, T)  # [B, T]
    per_seed_boot = np.einsum("est,bt->ebs", data, ct) / T  # task-resampled seed means
    boot = np.einsum("ebs,bs->eb", per_seed_boot, cs) / S  # [E, B]
    out: dict = {"estimators": {}, "vs_baseline": {}, "n_boot": n_boot,
                 "seeds": S, "tasks_per_seed": T, "resample": RESAMPLE}
    for e, name in enumerate(names):
        per_seed_means = data[e].mean(axis=1)
        out["estimators"][name] = {
            "final": [float(x) for x in per_seed_means], "mean": float(per_seed_means.mean()),
            "ci95": [float(np.percentile(boot[e], 2.5)), float(np.percentile(boot[e], 97.5))]}

    def paired(b: int) -> dict:
        pairs = {}
        for e, name in enumerate(names):
            if e == b:
                continue
            diff = boot[e] - boot[b]
            pairs[name] = {
                "diff_mean": float(data[e].mean() - data[b].mean()),
                "ci95": [float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))],
                "ci95_t": seed_t_interval(data[e].mean(axis=1) - data[b].mean(axis=1)),
                "p_leq_0": float((diff <= 0).mean())}
        return pairs

    if baseline in names:
        out["vs_baseline"] = paired(names.index(baseline))
    out["vs"] = {other: paired(names.index(other)) for other in also_vs}
    return out


def summarize_comparison(runs: dict, credits: list[str], splits: list[str],
                         baseline: str, also_vs: Sequence[str] = ()) -> dict:
    """compare.json: per split, the bootstrap statistics of final success."""
    seeds = sorted(next(iter(runs.values())))
    res: dict = {"credits": credits, "seeds": seeds, "baseline": baseline, "splits": {}}
    for split in splits:
        per_seed = {n: [np.asarray(runs[n][s]["final_eval"][split]["per_task_success"])
                        for s in seeds] for n in credits}
        stats = paired_bootstrap(per_seed, baseline, also_vs=also_vs)
        # episodes behind each seed's tasks (tasks x eval.samples_per_task)
        first = runs[credits[0]][seeds[0]]["final_eval"][split]
        stats["episodes_per_seed"] = int(first.get("episodes", len(first["per_task_success"])))
        for n in credits:
            stats["estimators"][n]["seeds"] = seeds
            stats["estimators"][n]["warmstart"] = [
                float(runs[n][s]["warmstart_eval"][split]["success"]) for s in seeds]
            # the raw data behind every statistic, so any of them can be recomputed
            stats["estimators"][n]["per_task_success"] = [x.tolist() for x in per_seed[n]]
        res["splits"][split] = stats
    res["episodes_per_eval"] = res["splits"][splits[0]]["episodes_per_seed"]
    return res


# ------------------------------------------------------------------------ plot
def _smooth(xs: list[float], k: int) -> list[float]:
    return [sum(xs[max(0, i - k + 1): i + 1]) / len(xs[max(0, i - k + 1): i + 1])
            for i in range(len(xs))]


def arm_curves(root: Path, name: str, seeds: Sequence[int], splits: Sequence[str]
               ) -> list[list[tuple[list, list]]]:
    """Per panel, per seed, (steps, success) of arm ``name``: panel 0 the training
    rollouts (smoothed), panel k the evaluations on ``splits[k - 1]`` (which may be the
    training split: an evaluation on the task pool RL trains on)."""
    curves: list[list] = [[] for _ in range(1 + len(splits))]
    for s in seeds:
        recs = read_metrics(root / f"seed_{s}" / name / "metrics.jsonl")
        train = sorted((r for r in recs if r["phase"] == "rl"), key=lambda r: r["step"])
        succ = [r.get("success_rate", 0.0) for r in train]
        curves[0].append(([r["step"] for r in train], _smooth(succ, max(1, len(succ) // 8))))
        for k, split in enumerate(splits, start=1):
            pts = sorted((r["step"], r["success"]) for r in recs
                         if r["phase"] == "eval" and r.get("split") == split)
            curves[k].append(([p[0] for p in pts], [p[1] for p in pts]))
    return curves


def plot_comparison(root: Path, credits: Sequence[str], seeds: Sequence[int], png: Path) -> Path:
    """Train success (smoothed) and eval success vs RL step: mean over seeds, band =
    min..max over seeds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs0 = read_metrics(root / f"seed_{seeds[0]}" / credits[0] / "metrics.jsonl")
    splits = sorted({r.get("split") for r in recs0 if r["phase"] == "eval"})
    fig, axes = plt.subplots(1, 1 + len(splits), figsize=(5.5 * (1 + len(splits)), 4))
    for i, name in enumerate(credits):
        color = f"C{i}"
        curves = arm_curves(root, name, seeds, splits)
        for k, ax in enumerate(axes):
            series = [c for c in curves[k] if c[0]]
            if not series:
                continue
            n = min(len(c[0]) for c in series)
            x = series[0][0][:n]
            y = np.array([c[1][:n] for c in series])
            ax.plot(x, y.mean(0), color=color, label=name, marker="o" if k else None)
            ax.fill_between(x, y.min(0), y.max(0), color=color, alpha=0.15)
    axes[0].set_title(f"train success (smoothed), {len(seeds)} seeds")
    for ax, split in zip(axes[1:], splits):
        ax.set_title(f"eval success [{split}]")
    for ax in axes:
        ax.set_xlabel("RL step")
        ax.set_ylabel("success rate")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def t_interval_note(d: dict) -> str:
    t = d.get("ci95_t")
    return f", seed-level t [{t[0]:+.3f}, {t[1]:+.3f}]" if t else ""


def format_comparison(results: dict) -> str:
    lines = []
    for split, st in results["splits"].items():
        lines.append(f"[{split}] final success, mean over seeds {results['seeds']} "
                     f"(95% CI, {st['tasks_per_seed']} tasks per seed):")
        for name, e in st["estimators"].items():
            lo, hi = e["ci95"]
            d = st["vs_baseline"].get(name)
            vs = (f"   vs {results['baseline']}: {d['diff_mean']:+.3f} "
                  f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]{t_interval_note(d)}") if d else ""
            lines.append(f"  {name:<16s} {e['mean']:.3f} [{lo:.3f}, {hi:.3f}]  "
                         f"warm start {np.mean(e['warmstart']):.3f}{vs}")
            for other, pairs in st.get("vs", {}).items():
                if name in pairs:
                    d = pairs[name]
                    lines.append(f"  {'':<16s} vs {other}: {d['diff_mean']:+.3f} "
                                 f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
                                 f"{t_interval_note(d)}")
    return "\n".join(lines)
