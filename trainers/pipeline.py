"""``turngym train``: the whole job as named phases, top to bottom.

    open the run dir -> warm start -> evaluate it -> set up RL ->
    per step: rollout -> credit -> update -> log -> (evaluate) -> (checkpoint)
    -> final evaluation -> final model, summary, plot

Each phase is a function in the module named for it (``warmstart``, ``rollout``,
``credit``, ``update``, ``evaluate``, ``checkpoint``, ``run``); this module only wires
them.  Under ``torchrun`` every rank runs this; rank 0 writes all files.

Run layout (``output_dir``)::

    config.yaml          resolved config (a resume must match it; see trainers/run.py)
    metrics.jsonl        one record per SFT/RL step and per evaluation
    warmstart/           the warm-started model (also the KL/TRACE reference)
    checkpoints/step_N/  atomic, checksummed RL checkpoints (the last step always saved)
    final/               the final model
    learning_curve.png   success and episode-length curves
    summary.json         warm-start vs final eval numbers
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from .. import credit as credit_lib
from ..agents.factory import build_policy, load_pretrained
from ..agents.policy import SupportsRelease, SupportsWeightSync
from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, RolloutConfig
from ..config import to_dict
from .checkpoint import (CheckpointManager, save_model_dir, set_shuffle_state, verify_manifest,
                         write_atomic_text)
from .credit import Brancher, assign_step_credit, credit_context, signal_fractions
from .distributed import World, close_world, init_world
from .evaluate import evaluate_model, evaluate_splits
from .fsdp import (full_optimizer_state, full_state_dict, load_full_optimizer_state,
                   shard_model, unsharded)
from .hardware import enable_gradient_checkpointing
from .lora import AdapterOff, add_lora, export_weights, is_lora, load_adapter, merged_copy
from .metrics import MetricsLogger, plot_learning_curve
from .rollout import collect_groups
from .run import ResumePoint, RunError, prepare_run_dir
from .samples import log_samples
from .runtime import (check_env_offers, env_factory, quiet_transformers, rollout_config,
                      seed_everything)
from .summary import summarize, without_tokens
from .update import PolicyGradientTrainer
from .warmstart import run_warmstart

__all__ = ["train", "evaluate_model", "env_factory", "rollout_config", "RunError"]


@dataclass
class RLRun:
    """Everything the RL loop uses, built once by :func:`setup_rl`."""

    model: Any
    tokenizer: Any
    reference: Any
    optimizer: torch.optim.Optimizer
    trainer: PolicyGradientTrainer
    policy: Any
    eval_policy: Any
    prompter: ChatPrompter
    pool: EnvPool
    rcfg: RolloutConfig
    params: Any  # the estimator's typed params
    credit_ctx: credit_lib.CreditContext
    brancher: Brancher
    checkpoints: CheckpointManager
    sharded: bool


class _NoLog:
    """Metrics sink of the non-zero ranks: only rank 0 writes files."""

    def log(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------ the job
def train(cfg: DictConfig, resume: bool = False, progress: bool = True,
          overwrite: bool = False, warm_start: str | Path | None = None,
          warm_start_eval: dict | None = None) -> dict:
    """Runs the whole job; returns the summary also written to ``summary.json``.

    ``warm_start``: an existing warm-start model directory to start RL from instead of
    training one, and ``warm_start_eval`` its evaluation on this config's eval splits
    (``turngym compare`` gives every estimator the same one)."""
    world, owned = init_world()
    try:
        return _train(_resolve_device(cfg, world), world, resume, overwrite,
                      progress and world.is_main, warm_start, warm_start_eval)
    finally:
        if owned:
            close_world(world)


def _train(cfg: DictConfig, world: World, resume: bool, overwrite: bool, progress: bool,
           warm_start, warm_start_eval) -> dict:
    quiet_transformers()
    torch.set_num_threads(max(1, cfg.threads))
    seed_everything(cfg.seed)
    t_start = time.time()
    check_env_offers(cfg)
    point, log = open_run(cfg, world, resume, overwrite)
    model, tok, summary = warm_start_phase(cfg, point, world, log, progress, warm_start)
    if "warmstart_eval" not in summary and warm_start_eval is not None:
        summary["warmstart_eval"] = warm_start_eval
        for split, m in warm_start_eval.items():
            log.log(0, "eval", {"split": split, **m})
    if "warmstart_eval" not in summary:
        summary["warmstart_eval"] = evaluate_splits(model, tok, cfg, world, log, 0, progress,
                                                    label="warm-start")
    run = setup_rl(cfg, model, tok, point, world)
    bar = tqdm(range(point.step, cfg.rl.steps), initial=point.step, total=cfg.rl.steps,
               desc="RL", disable=not progress)
    for step in bar:
        rec = rl_step(run, cfg, step, world, log)
        bar.set_postfix(succ=f"{rec['success_rate']:.2f}", turns=f"{rec['mean_turns']:.1f}")
        done = step + 1
        if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.rl.steps:
            evaluate_splits(run.model, tok, cfg, world, log, done, progress, run.eval_policy)
        if done == cfg.rl.steps or (cfg.checkpoint.every and done % cfg.checkpoint.every == 0):
            save_checkpoint(run, done, world, summary)
    bar.close()
    summary["final_eval"] = evaluate_splits(run.model, tok, cfg, world, log, cfg.rl.steps,
                                            progress, run.eval_policy, label="final")
    summary["wall_seconds_this_run"] = time.time() - t_start
    finish_run(cfg, run, world, log, summary)
    return summary


# ------------------------------------------------------------------------ phases
def open_run(cfg: DictConfig, world: World, resume: bool, overwrite: bool):
    """Checks and prepares the run dir (rank 0), prints the start banner, opens the log."""
    point = None
    if world.is_main:
        try:
            point = prepare_run_dir(cfg, resume, overwrite)
            _banner(cfg, world, point)
        except RunError as exc:  # every rank stops with the same message, none hangs
            world.broadcast(exc)
            raise
    point = world.broadcast(point)
    if isinstance(point, RunError):
        raise point
    log = (MetricsLogger(Path(cfg.output_dir) / "metrics.jsonl", cfg.logging.trackers,
                         cfg.output_dir, cfg.logging.project, to_dict(cfg))
           if world.is_main else _NoLog())
    for note in point.notes:
        log.log(point.step, "resume", {"note": note})
    return point, log


def warm_start_phase(cfg: DictConfig, point: ResumePoint, world: World, log, progress: bool,
                     warm_start=None):
    """(model, tokenizer, summary so far): the checkpoint to resume, the verified warm
    start, a given warm-start directory, or a fresh warm start (rank 0 alone; the other
    ranks load what it saved, so all begin from bit-identical weights)."""
    out = Path(cfg.output_dir)
    dtype, device = cfg.model.dtype, cfg.model.device
    if point.checkpoint is not None:
        state = CheckpointManager.state(point.checkpoint)
        if state.get("lora"):
            model, tok = load_pretrained(str(out / "warmstart"), dtype, device)
            model = load_adapter(model, point.checkpoint)
        else:
            model, tok = load_pretrained(str(point.checkpoint), dtype, device)
        return model, tok, dict(state.get("summary", {}))
    if not point.warmstart and world.is_main:
        if warm_start is not None:
            verify_manifest(Path(warm_start))
            shutil.copytree(warm_start, out / "warmstart", dirs_exist_ok=True)
        else:
            run_warmstart(cfg, out, log, progress)
    world.barrier()
    model, tok = load_pretrained(str(out / "warmstart"), dtype, device)
    if world.is_main:
        n = sum(p.numel() for p in model.parameters())
        print(f"model: {n / 1e6:.2f} M parameters, vocabulary {len(tok)}", flush=True)
    return model, tok, {}


def setup_rl(cfg: DictConfig, model, tok, point: ResumePoint, world: World) -> RLRun:
    """Reference, LoRA/checkpointing, sharding, optimizer (restored on resume), trainer,
    sampler, env pool and the credit estimator's services."""
    rl, out = cfg.rl, Path(cfg.output_dir)
    name = rl.credit.name
    params = credit_lib.make_params(name, to_dict(rl.credit.params) if rl.credit.params
                                    else {})
    needs = credit_lib.requirements(name)
    model, ref = _prepare_model(cfg, model, out, needs)
    sharded = rl.data_parallel == "fsdp" and world.distributed
    if sharded:
        shard_model(model, world)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=rl.lr,
                            weight_decay=rl.weight_decay)
    ckpts = CheckpointManager(out / "checkpoints", keep=cfg.checkpoint.keep)
    saved_rng = None
    if point.checkpoint is not None:
        _restore_optimizer(point.checkpoint, model, opt, sharded)
        saved_rng = ckpts.load_rng(point.checkpoint)
    rcfg = rollout_config(cfg)
    trainer = PolicyGradientTrainer(model, opt, rl, tok.pad_token_id,
                                    ref if rl.kl_coef > 0 else None, seed=cfg.seed, world=world,
                                    precision=cfg.model.autocast,
                                    temperature=rcfg.logprob_temperature)
    if saved_rng is not None:
        set_shuffle_state(saved_rng, trainer.rng)  # mini-batch order continues exactly
    policy = build_policy(cfg.agent, model, tok, str(out / "warmstart"),
                          seed=cfg.seed + world.rank, precision=cfg.model.autocast)
    if isinstance(policy, SupportsWeightSync) and (point.checkpoint is not None
                                                   or is_lora(model)):
        policy.sync_weights(_export(model, sharded))  # the engine started from the warm start
    prompter = ChatPrompter(tok, cfg.agent.system_prompt)
    pool = EnvPool(env_factory(cfg, cfg.env.train_split))
    brancher = Brancher(policy, prompter, pool, rcfg, point.step)
    ctx = credit_context(name, params, policy, model, ref, tok, brancher, cfg.model.autocast)
    return RLRun(model, tok, ref, opt, trainer, policy,
                 None if cfg.agent.backend == "hf" else policy, prompter, pool, rcfg, params,
                 ctx, brancher, ckpts, sharded)


def rl_step(run: RLRun, cfg: DictConfig, step: int, world: World, log) -> dict:
    """rollout -> credit -> update -> weight sync -> one log record."""
    t0 = time.time()
    with unsharded(run.model):
        groups = collect_groups(run.policy, run.prompter, run.pool, run.rcfg, cfg, step, world)
        t_roll = time.time() - t0
        t1 = time.time()
        run.brancher.version = step
        trained, credits, credit_metrics = assign_step_credit(cfg.rl.credit.name, run.params,
                                                              groups, run.credit_ctx)
        t_credit = time.time() - t1
        if world.is_main:  # a bounded sample of groups for `turngym view` (trainers/samples.py)
            log_samples(cfg, step + 1, trained, credits, run.params, run.credit_ctx, run.tokenizer)
    if isinstance(run.policy, SupportsRelease):
        run.policy.release()  # vLLM sleep mode: free the engine's memory for the update
    t2 = time.time()
    upd = run.trainer.update(trained, credits)
    if isinstance(run.policy, SupportsWeightSync):
        run.policy.sync_weights(_export(run.model, run.sharded))
    t_upd = time.time() - t2
    rec = _step_record(world, groups, credits, upd, credit_metrics,
                       {"rollout_s": t_roll, "credit_s": t_credit, "update_s": t_upd})
    rec.update(signal_fractions(world, trained, credits))
    log.log(step + 1, "rl", rec)
    return rec


def save_checkpoint(run: RLRun, step: int, world: World, summary: dict) -> None:
    """Rank 0 writes; under FSDP every rank first takes part in gathering the full
    weights and optimizer state."""
    state = {"phase": "rl", "summary": summary, "lora": is_lora(run.model),
             "sharded": run.sharded}
    tok, model = run.tokenizer, run.model
    if run.sharded:
        weights = full_state_dict(model, cpu=True)
        opt_state = full_optimizer_state(model, run.optimizer)
        if world.is_main:
            run.checkpoints.save(step, model, tok, None, state, model_state=weights,
                                 optimizer_state=opt_state, shuffle=run.trainer.rng)
    else:
        world.check_in_sync(model)
        if world.is_main:
            run.checkpoints.save(step, model, tok, run.optimizer, state,
                                 shuffle=run.trainer.rng)
    world.barrier()


def finish_run(cfg: DictConfig, run: RLRun, world: World, log, summary: dict) -> None:
    """Final model, summary, learning curve, and the closing line (rank 0)."""
    out = Path(cfg.output_dir)
    final_state = full_state_dict(run.model, cpu=True) if run.sharded else None
    if world.is_main:
        final = merged_copy(run.model) if is_lora(run.model) else run.model
        save_model_dir(out / "final", final, run.tokenizer,
                       {"phase": "final", "step": cfg.rl.steps}, final_state)
        write_atomic_text(out / "summary.json", json.dumps(summary, indent=1))
        log.close()
        written = ["final/", "summary.json", "metrics.jsonl"]
        try:
            plot_learning_curve(out / "metrics.jsonl", out / "learning_curve.png")
            written.append("learning_curve.png")
        except Exception as exc:  # plotting must never lose a finished run
            print(f"warning: could not plot the learning curve: {exc}")
        print(f"done in {summary['wall_seconds_this_run'] / 60:.1f} min; written to {out}: "
              + ", ".join(written), flush=True)
    world.barrier()


# ------------------------------------------------------------------------ helpers
def _resolve_device(cfg: DictConfig, world: World) -> DictConfig:
    """Under torchrun each rank takes its own GPU (``cuda`` -> ``cuda:<local_rank>``)."""
    if world.distributed and cfg.model.device == "cuda":
        cfg = cfg.copy()
        cfg.model.device = f"cuda:{world.local_rank}"
    return cfg


def _banner(cfg: DictConfig, world: World, point: ResumePoint) -> None:
    m = cfg.model
    model = (f"tiny {m.num_layers}x{m.hidden_size}" if m.kind == "tiny" else f"hf {m.path}")
    start = (f"resuming at step {point.step} ({point.checkpoint})" if point.checkpoint
             else "resuming after the warm start" if point.warmstart else "fresh run")
    print(f"turngym train: {start}\n  output  {cfg.output_dir}\n  env     {cfg.env.id} "
          f"(splits: train={cfg.env.train_split}, eval={','.join(cfg.env.eval_splits)})\n"
          f"  model   {model} on {m.device}"
          f"{f' x{world.size} ranks' if world.distributed else ''}, {cfg.threads} threads\n"
          f"  credit  {cfg.rl.credit.name}, {cfg.rl.steps} RL steps of "
          f"{cfg.rl.tasks_per_step}x{cfg.rl.group_size} episodes, "
          f"context {cfg.agent.context_mode.value}", flush=True)
    for note in point.notes:
        print(f"  note    {note}", flush=True)


def _prepare_model(cfg: DictConfig, model, out: Path, needs) -> tuple:
    """(model, reference): LoRA adapters and activation checkpointing as configured;
    the frozen reference is the warm start (the adapter-free base under LoRA)."""
    rl = cfg.rl
    if rl.lora.enabled and not is_lora(model):
        model = add_lora(model, rl.lora)
        for c in model.peft_config.values():  # saved adapters name their real base
            c.base_model_name_or_path = str(out / "warmstart")
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref = None
    if rl.kl_coef > 0 or "reference_scorer" in needs:
        if is_lora(model):
            ref = AdapterOff(model)
        else:
            ref, _ = load_pretrained(str(out / "warmstart"), cfg.model.dtype, cfg.model.device)
            ref.eval().requires_grad_(False)
    return model, ref


def _restore_optimizer(latest: Path, model, opt, sharded: bool) -> None:
    was_sharded = bool(CheckpointManager.state(latest).get("sharded", False))
    if was_sharded != sharded:
        raise RunError(f"{latest} was written with rl.data_parallel="
                       f"{'fsdp' if was_sharded else 'replicate'}; resume with the same")
    if sharded:
        load_full_optimizer_state(model, opt, torch.load(latest / "optimizer.pt",
                                                         weights_only=True))
    else:
        CheckpointManager.load_optimizer(latest, opt)


def _export(model, sharded: bool):
    """What a weight-syncing sampler (vLLM) loads after an update."""
    return list(full_state_dict(model).items()) if sharded else export_weights(model)


def _step_record(world: World, groups, credits, upd: dict, credit_metrics: dict,
                 times: dict) -> dict:
    """One RL log record over all ranks' episodes."""
    local = groups if not world.distributed else without_tokens(groups)
    m = summarize(world.concat_gather(local))
    rec = {"success_rate": m.get("success", 0.0), "mean_turns": m.get("mean_turns", 0.0),
           "invalid_action_rate": m.get("invalid_action_rate", 0.0),
           "format_error_rate": m.get("format_error_rate", 0.0), **upd, **times,
           "rollout_tok_per_s": upd.get("response_tokens", 0) / max(times["rollout_s"], 1e-9),
           "train_tok_per_s": upd.get("train_tokens", 0) / max(times["update_s"], 1e-9)}
    metrics = world.concat_gather([c.metrics for c in credits])
    for cm in metrics:
        for k, v in cm.items():
            rec[f"credit/{k}"] = rec.get(f"credit/{k}", 0.0) + v / len(metrics)
    for k, v in credit_metrics.items():
        rec[f"credit/{k}"] = world.all_reduce_sum([v])[0]
    if world.distributed:
        rec["world_size"] = world.size
    return rec
