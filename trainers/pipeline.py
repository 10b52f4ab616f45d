"""``turngym train`` / ``turngym eval``: warm-start, RL loop, evaluation, checkpoints.

Run layout (``output_dir``)::

    config.yaml          resolved config
    metrics.jsonl        one record per SFT/RL step and per evaluation
    warmstart/           the warm-started model (also the KL reference)
    checkpoints/step_N/  atomic RL checkpoints; checkpoints/latest names the newest
    final/               the final model
    learning_curve.png   success and episode-length curves
    summary.json         warm-start vs final eval numbers
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from .. import credit as credit_lib
from ..agents.branching import continue_from
from ..agents.factory import build_policy, load_pretrained
from ..agents.hf_backend import HFPolicy
from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, rollout
from ..types import TrajectoryGroup
from .checkpoint import CheckpointManager, save_model_dir, write_atomic_text
from .distributed import World, close_world, init_world
from .evaluate import format_report, summarize
from .fsdp import (
    full_optimizer_state,
    full_state_dict,
    gathered,
    load_full_optimizer_state,
    shard_model,
)
from .hardware import enable_gradient_checkpointing
from .lora import AdapterOff, add_lora, export_weights, is_lora, load_adapter, merged_copy
from .metrics import MetricsLogger, plot_learning_curve
from .rl import PolicyGradientTrainer
from .runtime import env_factory, quiet_transformers, rollout_config, seed_everything
from .warmstart import run_warmstart

__all__ = ["env_factory", "rollout_config", "train", "evaluate_model", "evaluate_checkpoint",
           "credit_context", "make_judge"]


def evaluate_model(model, tokenizer, cfg: DictConfig, split: str, progress: bool = True,
                   world: World | None = None, policy=None) -> dict:
    """Fixed task set (indices seed_offset..+num_tasks) and a fixed sampler seed,
    so two models are compared on identical tasks and random streams.  Under
    ``torchrun`` each rank plays a strided share of the tasks and every rank
    returns the metrics of all of them."""
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
    rcfg = rollout_config(cfg, temperature=cfg.eval.temperature, greedy=cfg.eval.greedy)
    groups: list[TrajectoryGroup] = []
    chunk = max(1, cfg.agent.max_batch_size)
    bar = tqdm(total=len(seeds), desc=f"eval {split}", leave=False, disable=not progress)
    for s in range(0, len(seeds), chunk):
        groups += rollout(policy, prompter, pool, seeds[s:s + chunk], 1, rcfg)
        bar.update(len(seeds[s:s + chunk]))
    bar.close()
    return _summarize_all(world, groups)


def _gathered(world: World, items: list) -> list:
    """Every rank's list, concatenated in rank order (the list itself on one process)."""
    return items if not world.distributed else [x for part in world.all_gather(items)
                                                for x in part]


def _without_tokens(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """The groups as metrics see them: token ids and log-probs dropped, so gathering
    every rank's episodes for a log record moves kilobytes, not the whole batch."""
    empty = ((), (), (), ())
    return [TrajectoryGroup(tuple(
        dataclasses.replace(t, turns=tuple(dataclasses.replace(
            x, **dict(zip(("prompt_ids", "response_ids", "response_mask", "logprobs"), empty)))
            for x in t.turns)) for t in g), g.task_id) for g in groups]


def _summarize_all(world: World, groups: list[TrajectoryGroup]) -> dict:
    local = groups if not world.distributed else _without_tokens(groups)
    return summarize(_gathered(world, local))


def credit_context(needs, policy, model, ref, tokenizer, params: dict, brancher=None,
                   precision: str | None = None) -> credit_lib.CreditContext:
    """Builds the services the chosen estimator declared (answer scorers over the
    current policy and/or the frozen warm-start reference)."""
    template = params.get("answer_template", credit_lib.scoring.DEFAULT_ANSWER_TEMPLATE)
    if not hasattr(policy, "model"):  # e.g. vLLM: estimators read entropies off the
        policy = HFPolicy(model, tokenizer, precision=precision)  # trainer's copy instead
    ctx = credit_lib.CreditContext(policy=policy, reference=ref, brancher=brancher)
    if "scorer" in needs:
        ctx.scorer = credit_lib.GoldScorer(model, tokenizer, template, precision=precision)
    if "reference_scorer" in needs:
        ctx.reference_scorer = credit_lib.GoldScorer(ref, tokenizer, template,
                                                     precision=precision)
    if "judge" in needs:
        ctx.judge = make_judge(params.get("judge") or {"kind": "oracle"})
    return ctx


def make_judge(spec: dict):
    """``{"kind": "oracle"}`` or ``{"kind": "openai", "base_url": ..., ...OpenAIJudge args}``."""
    from ..credit.llm_judge import OpenAIJudge
    from ..credit.roles import OracleJudge

    spec = dict(spec)
    kind = spec.pop("kind", "oracle")
    if kind == "oracle":
        return OracleJudge()
    if kind == "openai":
        if "base_url" not in spec:
            raise ValueError("an openai judge needs base_url (e.g. http://127.0.0.1:8001/v1)")
        return OpenAIJudge(**spec)
    raise ValueError(f"unknown judge kind {kind!r}; use oracle or openai")


class _NoLog:
    """Metrics sink of the non-zero ranks: only rank 0 writes files."""

    def log(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def _resolve_device(cfg: DictConfig, world: World) -> DictConfig:
    """Under torchrun each rank takes its own GPU (``cuda`` -> ``cuda:<local_rank>``)."""
    if world.distributed and cfg.model.device == "cuda":
        cfg = cfg.copy()
        cfg.model.device = f"cuda:{world.local_rank}"
    return cfg


def _load_start(cfg: DictConfig, out: Path, latest: Path | None, resume: bool, log, world: World,
                progress: bool):
    """(model, tokenizer, start step, summary so far) for a fresh, resumed or joined run.
    Rank 0 alone warm-starts; the other ranks load what it saved, so all ranks begin
    from bit-identical weights."""
    dtype, device = cfg.model.dtype, cfg.model.device
    if latest is not None:
        state = CheckpointManager.state(latest)
        if state.get("lora"):
            model, tok = load_pretrained(str(out / "warmstart"), dtype, device)
            model = load_adapter(model, latest)
        else:
            model, tok = load_pretrained(str(latest), dtype, device)
        return model, tok, int(state["step"]), state.get("summary", {})
    if resume and (out / "warmstart" / "config.json").exists():
        model, tok = load_pretrained(str(out / "warmstart"), dtype, device)
        return model, tok, 0, {}
    if world.is_main:
        model, tok = run_warmstart(cfg, out, log, progress)
    world.barrier()
    if not world.is_main:
        model, tok = load_pretrained(str(out / "warmstart"), dtype, device)
    return model, tok, 0, {}


def _prepare_for_rl(cfg: DictConfig, model, out: Path, needs) -> tuple:
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


def _step_record(world: World, groups, credits, upd: dict, times: dict) -> dict:
    """One RL log record over all ranks' episodes."""
    m = _summarize_all(world, groups)
    rec = {"success_rate": m["success"], "mean_turns": m["mean_turns"],
           "invalid_action_rate": m["invalid_action_rate"],
           "format_error_rate": m["format_error_rate"], **upd, **times,
           "rollout_tok_per_s": upd.get("response_tokens", 0) / max(times["rollout_s"], 1e-9),
           "train_tok_per_s": upd.get("train_tokens", 0) / max(times["update_s"], 1e-9)}
    metrics = _gathered(world, [c.metrics for c in credits])
    for cm in metrics:
        for k, v in cm.items():
            rec[f"credit/{k}"] = rec.get(f"credit/{k}", 0.0) + v / len(metrics)
    if world.distributed:
        rec["world_size"] = world.size
    return rec


def _restore_optimizer(ckpts: CheckpointManager, latest: Path, model, opt, sharded: bool) -> None:
    was_sharded = bool(CheckpointManager.state(latest).get("sharded", False))
    if was_sharded != sharded:
        raise ValueError(f"{latest} was written with rl.data_parallel="
                         f"{'fsdp' if was_sharded else 'replicate'}; resume with the same")
    if sharded:
        load_full_optimizer_state(model, opt, torch.load(latest / "optimizer.pt",
                                                         weights_only=False))
    else:
        ckpts.load_optimizer(latest, opt)


def _save_checkpoint(ckpts: CheckpointManager, step: int, model, tok, opt, world: World,
                     sharded: bool, state: dict) -> None:
    """Rank 0 writes; under FSDP every rank first takes part in gathering the full
    weights and optimizer state."""
    if sharded:
        weights, opt_state = full_state_dict(model, cpu=True), full_optimizer_state(model, opt)
        if world.is_main:
            ckpts.save(step, model, tok, None, state, model_state=weights,
                       optimizer_state=opt_state)
    else:
        world.check_in_sync(model)
        if world.is_main:
            ckpts.save(step, model, tok, opt, state)
    world.barrier()


def train(cfg: DictConfig, resume: bool = False, progress: bool = True) -> dict:
    """Runs the whole job; returns the summary also written to ``summary.json``.
    Under ``torchrun`` every rank runs this; rank 0 writes all files."""
    world, owned = init_world()
    try:
        return _train(_resolve_device(cfg, world), world, resume, progress and world.is_main)
    finally:
        if owned:
            close_world(world)


def _train(cfg: DictConfig, world: World, resume: bool, progress: bool) -> dict:
    quiet_transformers()
    torch.set_num_threads(max(1, cfg.threads))
    seed_everything(cfg.seed)
    out = Path(cfg.output_dir)
    ckpts = CheckpointManager(out / "checkpoints", keep=cfg.checkpoint.keep)
    latest = ckpts.latest() if resume else None
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        if not resume and (out / "metrics.jsonl").exists():
            (out / "metrics.jsonl").unlink()  # a fresh run starts a fresh log
        write_atomic_text(out / "config.yaml", OmegaConf.to_yaml(cfg))
    log = MetricsLogger(out / "metrics.jsonl", out / "tensorboard") if world.is_main else _NoLog()
    t_start = time.time()

    model, tok, start_step, summary = _load_start(cfg, out, latest, resume, log, world, progress)
    if "warmstart_eval" not in summary:
        summary["warmstart_eval"] = {}
        for split in cfg.env.eval_splits:
            m = evaluate_model(model, tok, cfg, split, progress, world)
            summary["warmstart_eval"][split] = m
            log.log(0, "eval", {"split": split, **m})
            if world.is_main:
                print(format_report(f"warm-start [{split}]", m), flush=True)

    rl = cfg.rl
    needs = credit_lib.requirements(rl.credit.name)
    model, ref = _prepare_for_rl(cfg, model, out, needs)
    if rl.data_parallel not in ("replicate", "fsdp"):
        raise ValueError(f"rl.data_parallel must be replicate or fsdp, not {rl.data_parallel!r}")
    sharded = rl.data_parallel == "fsdp" and world.distributed
    if sharded:
        shard_model(model, world)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=rl.lr,
                            weight_decay=rl.weight_decay)
    if latest is not None:
        _restore_optimizer(ckpts, latest, model, opt, sharded)
        ckpts.load_rng(latest)
    trainer = PolicyGradientTrainer(model, opt, rl, tok.pad_token_id,
                                    ref if rl.kl_coef > 0 else None, seed=cfg.seed, world=world,
                                    precision=cfg.model.autocast)

    def weights():  # what the vLLM engine loads after an update
        return list(full_state_dict(model).items()) if sharded else export_weights(model)

    policy = build_policy(cfg.agent, model, tok, str(out / "warmstart"),
                          seed=cfg.seed + world.rank, precision=cfg.model.autocast)
    if cfg.agent.backend != "hf" and (latest is not None or is_lora(model)):
        policy.sync_weights(weights())  # the engine started from the warm start
    eval_policy = None if cfg.agent.backend == "hf" else policy
    prompter = ChatPrompter(tok, cfg.agent.system_prompt)
    pool = EnvPool(env_factory(cfg, cfg.env.train_split))
    rcfg = rollout_config(cfg)
    credit_params = OmegaConf.to_container(rl.credit.params, resolve=True) or {}
    version = {"step": start_step}

    def brancher(points):  # exact-prefix continuations for branch-based credit
        return continue_from(policy, prompter, pool, points, rcfg, version["step"])

    credit_ctx = credit_context(needs, policy, model, ref, tok, credit_params, brancher,
                                cfg.model.autocast)

    def evaluate_all(step: int) -> dict:
        res = {}
        with gathered(model):  # rank-local forwards on full weights (FSDP)
            for split in cfg.env.eval_splits:
                res[split] = evaluate_model(model, tok, cfg, split, progress, world,
                                            eval_policy)
                log.log(step, "eval", {"split": split, **res[split]})
        return res

    bar = tqdm(range(start_step, rl.steps), initial=start_step, total=rl.steps, desc="RL",
               disable=not progress)
    for step in bar:
        step_rng = np.random.default_rng([cfg.seed, step])
        policy.generator.manual_seed(int(step_rng.integers(2**62)) + world.rank)
        hi = rl.task_pool if rl.task_pool else 2**31 - 1
        seeds = world.shard(step_rng.integers(0, hi, size=rl.tasks_per_step).tolist())
        t0 = time.time()
        version["step"] = step
        with gathered(model):
            groups = (rollout(policy, prompter, pool, seeds, rl.group_size, rcfg,
                              policy_version=step) if seeds else [])
            t_roll = time.time() - t0
            t_c = time.time()
            credits = (credit_lib.assign_credit(rl.credit.name, groups, credit_params,
                                                credit_ctx) if groups else [])
            t_credit = time.time() - t_c
        if hasattr(policy, "release"):
            policy.release()  # vLLM sleep mode: free the engine's memory for the update
        t1 = time.time()
        upd = trainer.update(groups, credits)
        if hasattr(policy, "sync_weights"):
            policy.sync_weights(weights())
        t_upd = time.time() - t1
        rec = _step_record(world, groups, credits, upd,
                           {"rollout_s": t_roll, "update_s": t_upd, "credit_s": t_credit})
        log.log(step + 1, "rl", rec)
        bar.set_postfix(succ=f"{rec['success_rate']:.2f}", turns=f"{rec['mean_turns']:.1f}")
        done = step + 1
        if cfg.eval.every and done % cfg.eval.every == 0 and done < rl.steps:
            evaluate_all(done)
        if cfg.checkpoint.every and done % cfg.checkpoint.every == 0:
            _save_checkpoint(ckpts, done, model, tok, opt, world, sharded,
                             {"phase": "rl", "summary": summary, "lora": is_lora(model),
                              "sharded": sharded})
    bar.close()

    summary["final_eval"] = evaluate_all(rl.steps)
    if world.is_main:
        for split, m in summary["final_eval"].items():
            print(format_report(f"final [{split}]", m), flush=True)
    final_state = full_state_dict(model, cpu=True) if sharded else None
    if world.is_main:
        final = merged_copy(model) if is_lora(model) else model
        save_model_dir(out / "final", final, tok, {"phase": "final", "step": rl.steps},
                       final_state)
    summary["wall_seconds_this_run"] = time.time() - t_start
    if world.is_main:
        write_atomic_text(out / "summary.json", json.dumps(summary, indent=1))
        log.close()
        try:
            png = plot_learning_curve(out / "metrics.jsonl", out / "learning_curve.png")
            summary["plot"] = str(png)
        except Exception as exc:  # plotting must never lose a finished run
            print(f"warning: could not plot the learning curve: {exc}")
    world.barrier()
    return summary


def evaluate_checkpoint(cfg: DictConfig, checkpoint: str, splits=None, progress: bool = True
                        ) -> dict:
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
