"""Metrics: JSONL (always), tensorboard and wandb (optional trackers), learning-curve PNG."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Sequence


class MetricsLogger:
    """Writes every record to ``metrics.jsonl`` (always) and to the optional trackers.

    ``trackers``: ``jsonl`` (always on), ``tensorboard`` (``RUN/tensorboard``) and
    ``wandb`` (offline unless ``WANDB_MODE`` says otherwise: no network is needed; sync
    later with ``wandb sync RUN/wandb/offline-run-*``).  A torn last line left by a
    crash is closed before appending, so the next record is never lost."""

    def __init__(self, path: str | Path, trackers: Sequence[str] = ("jsonl",),
                 run_dir: str | Path | None = None, project: str = "turngym",
                 config: dict | None = None, run_name: str | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        run_dir = Path(run_dir) if run_dir is not None else self.path.parent
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
            if torn:
                with open(self.path, "a") as f:
                    f.write("\n")
        self._tb = self._wandb = None
        if "tensorboard" in trackers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise RuntimeError("logging.trackers has tensorboard, which is not installed: "
                                   "pip install 'turngym[tensorboard]'") from exc
            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        if "wandb" in trackers:
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("logging.trackers has wandb, which is not installed: "
                                   "pip install 'turngym[wandb]'") from exc
            self._wandb = wandb.init(project=project, dir=str(run_dir), config=config or {},
                                     name=run_name or run_dir.name,
                                     mode=os.environ.get("WANDB_MODE", "offline"),
                                     reinit="finish_previous")

    def log(self, step: int, phase: str, metrics: dict[str, Any]) -> None:
        rec = {"step": step, "phase": phase, "time": time.time(), **metrics}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, default=float) + "\n")
        scalars = {f"{phase}/{k}" + (f"/{metrics['split']}" if "split" in metrics else ""): v
                   for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({**scalars, "step": step})

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def truncate_after(path: str | Path, phase: str, step: int) -> int:
    """Drops the records of ``phase`` (and evaluations) logged after ``step`` -- what a
    resumed run is about to redo -- atomically; returns how many were dropped."""
    p = Path(path)
    if not p.exists():
        return 0
    keep, dropped = [], 0
    for line in p.read_text().splitlines():
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if r.get("phase") in (phase, "eval") and r.get("step", 0) > step:
            dropped += 1
            continue
        keep.append(line)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, p)
    return dropped


def read_metrics(path: str | Path) -> list[dict]:
    """Records in file order; for a step logged twice in a phase (a resumed run)
    the later record wins.  Distinct notes logged at one step are all kept."""
    p = Path(path)
    if not p.exists():
        return []
    recs: dict[tuple, dict] = {}
    for line in p.read_text().splitlines():
        if line.strip():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a torn last line after a crash
                continue
            # notes (resume, ...) are events, all kept; measurements are keyed by step
            key = (r.get("phase"), r.get("step"), r.get("split"), r.get("note"))
            recs[key] = r
    return list(recs.values())


def plot_learning_curve(metrics_path: str | Path, out_png: str | Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_metrics(metrics_path)
    train = sorted((r for r in recs if r["phase"] == "rl"), key=lambda r: r["step"])
    evals = [r for r in recs if r["phase"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    if train:
        steps = [r["step"] for r in train]
        succ = [r.get("success_rate", 0.0) for r in train]
        ax.plot(steps, succ, alpha=0.35, label="train success (per step)")
        k = max(1, len(succ) // 10)
        smooth = [sum(succ[max(0, i - k + 1): i + 1]) / len(succ[max(0, i - k + 1): i + 1])
                  for i in range(len(succ))]
        ax.plot(steps, smooth, label=f"train success (mean of {k})")
    for split in sorted({r.get("split") for r in evals}):
        pts = sorted((r["step"], r["success"]) for r in evals if r.get("split") == split)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"eval {split}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_title("success")
    ax = axes[1]
    if train:
        ax.plot([r["step"] for r in train], [r.get("mean_turns", 0) for r in train],
                label="mean turns")
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in train], [r.get("invalid_action_rate", 0) for r in train],
                 color="tab:red", label="invalid-action rate")
        ax2.set_ylabel("invalid-action rate")
        ax2.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("RL step")
    ax.set_ylabel("turns")
    if train:
        ax.legend(loc="upper left", fontsize=8)
    ax.set_title("episode length / invalid actions")
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
