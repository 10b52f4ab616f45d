"""Evaluation phase: fixed task sets, fixed sampler seeds, every eval split.

Tasks ``eval.seed_offset .. + eval.num_tasks`` of each split (``eval.samples_per_task``
episodes each; a task's success is their mean) and a sampler seed fixed by the run seed,
so two models (the warm start and the final policy, or two credit estimators) are
compared on identical tasks and random streams.  Under ``torchrun``
each rank plays a strided share and every rank gets the metrics of all of them.
The random streams are per rank and batch (``seed + 7919 + rank``, drawn through batches
of ``agent.max_batch_size // eval.samples_per_task`` tasks): evaluations are paired when
they share the world size and ``agent.max_batch_size``, as every arm of a comparison does;
the same checkpoint evaluated under another world size plays the same tasks with other
draws.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ..agents.factory import build_policy, load_pretrained
from ..agents.hf_backend import HFPolicy
from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, rollout
from ..types import TrajectoryGroup
from .distributed import World
from .fsdp import unsharded
from .runtime import env_factory, quiet_transformers, rollout_config
from .summary import format_report, summarize, without_tokens


def evaluate_model(model, tokenizer, cfg: DictConfig, split: str, progress: bool = True,
                   world: World | None = None, policy=None) -> dict:
    """Metrics of ``model`` (or of ``policy`` sampling it, e.g. a vLLM engine) on
    ``split``."""
    world = world or World.local()
    seed = cfg.seed + 7919 + world.rank
    if policy is None:
        policy = HFPolicy(model, tokenizer, max_batch_size=cfg.agent.max_batch_size,
                          generator_seed=seed, precision=cfg.model.autocast)
    else:
        policy.generator.manual_seed(seed)
    prompter = ChatPrompter(tokenizer, cfg.agent.system_prompt)
    pool = EnvPool(env_factory(cfg, split))
    seeds = world.shard(range(cfg.eval.seed_offset, cfg.eval.seed_offset + cfg.eval.num_tasks))
    rcfg = rollout_config(cfg, evaluation=True)
    groups: list[TrajectoryGroup] = []
    k = cfg.eval.samples_per_task
    chunk = max(1, cfg.agent.max_batch_size // k)
    bar = tqdm(total=len(seeds), desc=f"eval {split}", leave=False, disable=not progress)
    for s in range(0, len(seeds), chunk):
        groups += rollout(policy, prompter, pool, seeds[s:s + chunk], k, rcfg)
        bar.update(len(seeds[s:s + chunk]))
    bar.close()
    local = groups if not world.distributed else without_tokens(groups)
    everyone = world.concat_gather(local)
    out = summarize(everyone)
    # per task, in task order (the mean over its samples): paired comparisons resample
    # the same tasks for every model
    out["per_task_success"] = per_task_success(everyone)
    return out


def per_task_success(groups: list[TrajectoryGroup]) -> list[float]:
    """Each task's mean success over its episodes, in task-seed order."""
    by_seed: dict[int, list[float]] = {}
    for g in groups:
        for t in g:
            by_seed.setdefault(int(t.info["task_seed"]), []).append(float(t.success))
    return [sum(v) / len(v) for _, v in sorted(by_seed.items())]


def evaluate_splits(model, tokenizer, cfg: DictConfig, world: World, log, step: int,
                    progress: bool, policy=None, label: str | None = None) -> dict:
    """Every eval split, logged at ``step`` (and printed when ``label`` is given)."""
    res = {}
    with unsharded(model):  # rank-local forwards on full weights (FSDP)
        for split in cfg.env.eval_splits:
            res[split] = evaluate_model(model, tokenizer, cfg, split, progress, world, policy)
            log.log(step, "eval", {"split": split, **res[split]})
            if label and world.is_main:
                print(format_report(f"{label} [{split}]", res[split]), flush=True)
    return res


def run_config_for(checkpoint: str | Path) -> Path | None:
    """The ``config.yaml`` of the run a model directory belongs to (``RUN/final``,
    ``RUN/warmstart``, ``RUN/checkpoints/step_N``), if there is one."""
    p = Path(checkpoint).resolve()
    for parent in (p, p.parent, p.parent.parent):
        if (parent / "config.yaml").is_file() and parent != p:
            return parent / "config.yaml"
    return None


def evaluate_checkpoint(cfg: DictConfig, checkpoint: str, splits=None, progress: bool = True
                        ) -> dict:
    """``turngym eval``: a model directory on the eval splits (vLLM when configured)."""
    if not Path(checkpoint).is_dir():
        raise FileNotFoundError(f"checkpoint {checkpoint}: no such model directory")
    quiet_transformers()
    torch.set_num_threads(max(1, cfg.threads))
    model, tok = load_pretrained(checkpoint, cfg.model.dtype, cfg.model.device)
    # agent.backend=vllm: the engine loads the checkpoint directory itself
    policy = None if cfg.agent.backend == "hf" else build_policy(
        cfg.agent, model, tok, checkpoint, seed=cfg.seed)
    res = {}
    for split in splits or cfg.env.eval_splits:
        res[split] = evaluate_model(model, tok, cfg, split, progress, policy=policy)
        print(format_report(f"{checkpoint} [{split}]", res[split]), flush=True)
    return res
