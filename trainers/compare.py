"""Credit-module comparison: one shared warm start, then the same RL run (same seeds,
tasks and sampler streams) with each credit estimator; learning curves on one plot.

Layout (``output_dir``)::

    shared/              the warm-start run (SFT once; its warmstart/ is copied to each)
    <credit name>/       a full training run per estimator (metrics.jsonl, summary.json, ...)
    compare.json         final eval per estimator and split
    compare.png          train success (smoothed) and eval success vs RL step, per estimator
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from .checkpoint import write_atomic_text
from .metrics import read_metrics


def _with(cfg: DictConfig, **dot) -> DictConfig:
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for k, v in dot.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return cfg


def compare_credits(cfg: DictConfig, credits: Sequence[str], progress: bool = True) -> dict:
    from .pipeline import train

    root = Path(cfg.output_dir)
    shared = root / "shared"
    if not (shared / "warmstart" / "config.json").exists():
        train(_with(cfg, output_dir=str(shared), **{"rl.steps": 0}), progress=progress)
    results: dict = {"credits": list(credits), "runs": {}}
    for name in credits:
        out = root / name
        if not (out / "warmstart" / "config.json").exists():
            shutil.copytree(shared / "warmstart", out / "warmstart", dirs_exist_ok=True)
        run_cfg = _with(cfg, output_dir=str(out), **{"rl.credit.name": name})
        if not (out / "summary.json").exists():
            train(run_cfg, resume=True, progress=progress)
        summary = json.loads((out / "summary.json").read_text())
        results["runs"][name] = {"warmstart_eval": summary.get("warmstart_eval", {}),
                                 "final_eval": summary.get("final_eval", {})}
    write_atomic_text(root / "compare.json", json.dumps(results, indent=1))
    try:
        plot_comparison(root, credits, root / "compare.png")
    except Exception as exc:  # the numbers matter more than the picture
        print(f"warning: could not plot the comparison: {exc}")
    return results


def _smooth(xs: list[float], k: int) -> list[float]:
    return [sum(xs[max(0, i - k + 1): i + 1]) / len(xs[max(0, i - k + 1): i + 1])
            for i in range(len(xs))]


def plot_comparison(root: Path, credits: Sequence[str], png: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for i, name in enumerate(credits):
        recs = read_metrics(root / name / "metrics.jsonl")
        train = sorted((r for r in recs if r["phase"] == "rl"), key=lambda r: r["step"])
        color = f"C{i}"
        if train:
            succ = [r.get("success_rate", 0.0) for r in train]
            axes[0].plot([r["step"] for r in train], _smooth(succ, max(1, len(succ) // 8)),
                         color=color, label=name)
        evals = [r for r in recs if r["phase"] == "eval"]
        for j, split in enumerate(sorted({r.get("split") for r in evals})):
            pts = sorted((r["step"], r["success"]) for r in evals if r.get("split") == split)
            axes[1].plot([p[0] for p in pts], [p[1] for p in pts], "o-" if j == 0 else "s--",
                         color=color, label=f"{name} [{split}]")
    axes[0].set_title("train success (smoothed)")
    axes[1].set_title("eval success (fixed tasks and sampler seed)")
    for ax in axes:
        ax.set_xlabel("RL step")
        ax.set_ylabel("success rate")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def format_comparison(results: dict) -> str:
    lines = []
    for name, run in results["runs"].items():
        for split, m in run["final_eval"].items():
            ws = run["warmstart_eval"].get(split, {}).get("success")
            extra = f" (warm start {ws:.3f})" if ws is not None else ""
            f1 = f", F1 {m['f1']:.3f}" if "f1" in m else ""
            lines.append(f"{name:<14s} [{split}] success {m['success']:.3f}{f1}{extra}")
    return "\n".join(lines)
