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

import json
import random
import time
from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from .. import credit as credit_lib
from ..agents.branching import continue_from
from ..agents.factory import build_model, load_pretrained
from ..agents.hf_backend import HFPolicy
from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, RolloutConfig, rollout
from ..types import TrajectoryGroup
from .checkpoint import CheckpointManager, save_model_dir, write_atomic_text
from .demos import collect_demos, demo_rows, demo_texts, lm_rows
from .evaluate import format_report, summarize
from .metrics import MetricsLogger, plot_learning_curve
from .rl import PolicyGradientTrainer
from .sft import sft_train


def env_factory(cfg: DictConfig, split: str) -> Callable[[], gym.Env]:
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) or {}
    kwargs = dict(kwargs, **{cfg.env.split_kwarg: split}) if cfg.env.split_kwarg else kwargs
    env_id = cfg.env.id

    def make() -> gym.Env:
        return gym.make(env_id, **kwargs)
    return make


def rollout_config(cfg: DictConfig, *, temperature: float | None = None, greedy: bool = False
                   ) -> RolloutConfig:
    a = cfg.agent
    return RolloutConfig(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens,
                         temperature=a.temperature if temperature is None else temperature,
                         top_p=a.top_p, greedy=greedy, max_context_tokens=a.max_context_tokens,
                         max_invalid_streak=a.max_invalid_streak, require_think=a.require_think,
                         show_admissible=a.show_admissible, action_parser=a.action_parser)


def evaluate_model(model, tokenizer, cfg: DictConfig, split: str, progress: bool = True) -> dict:
    """Fixed task set (indices seed_offset..+num_tasks) and a fixed sampler seed,
    so two models are compared on identical tasks and random streams."""
    policy = HFPolicy(model, tokenizer, max_batch_size=cfg.agent.max_batch_size,
                      generator_seed=cfg.seed + 7919)
    prompter = ChatPrompter(tokenizer, cfg.agent.system_prompt)
    pool = EnvPool(env_factory(cfg, split))
    seeds = list(range(cfg.eval.seed_offset, cfg.eval.seed_offset + cfg.eval.num_tasks))
    rcfg = rollout_config(cfg, temperature=cfg.eval.temperature, greedy=cfg.eval.greedy)
    groups: list[TrajectoryGroup] = []
    chunk = max(1, cfg.agent.max_batch_size)
    bar = tqdm(total=len(seeds), desc=f"eval {split}", leave=False, disable=not progress)
    for s in range(0, len(seeds), chunk):
        groups += rollout(policy, prompter, pool, seeds[s:s + chunk], 1, rcfg)
        bar.update(len(seeds[s:s + chunk]))
    bar.close()
    return summarize(groups)


def credit_context(needs, policy, model, ref, tokenizer, params: dict, brancher=None
                   ) -> credit_lib.CreditContext:
    """Builds the services the chosen estimator declared (answer scorers over the
    current policy and/or the frozen warm-start reference)."""
    template = params.get("answer_template", credit_lib.scoring.DEFAULT_ANSWER_TEMPLATE)
    ctx = credit_lib.CreditContext(policy=policy, reference=ref, brancher=brancher)
    if "scorer" in needs:
        ctx.scorer = credit_lib.GoldScorer(model, tokenizer, template)
    if "reference_scorer" in needs:
        ctx.reference_scorer = credit_lib.GoldScorer(ref, tokenizer, template)
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


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # pragma: no cover
        pass


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _supervised(model, rows, ws, epochs: int, pad_id: int, seed: int, log: MetricsLogger,
                phase: str, desc: str, progress: bool) -> float:
    """One supervised phase (corpus LM or demo SFT) with a bar and a log every 10 steps."""
    bar = tqdm(total=-(-len(rows) // ws.batch_size) * epochs, desc=desc, leave=False,
               disable=not progress)

    def on_step(step: int, rec: dict) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{rec['sft_loss']:.3f}")
        if step % 10 == 0:
            log.log(step, phase, rec)

    t0 = time.time()
    sft_train(model, rows, epochs, ws.lr, ws.batch_size, ws.token_budget, pad_id, seed=seed,
              weight_decay=ws.weight_decay, warmup_steps=ws.warmup_steps, on_step=on_step)
    bar.close()
    return time.time() - t0


def _warmstart(cfg: DictConfig, out: Path, log: MetricsLogger, progress: bool = True):
    ws = cfg.warmstart
    make_train = env_factory(cfg, cfg.env.train_split)
    demos = []
    if ws.enabled or cfg.model.kind == "tiny":
        n = ws.num_demos if ws.enabled else min(ws.num_demos, 200)
        bar = tqdm(total=n, desc="collecting demos", leave=False, disable=not progress)
        demos = collect_demos(make_train, n, ws.epsilon, cfg.seed,
                              ws.max_turns or cfg.agent.max_turns, progress=bar.update,
                              show_admissible=cfg.agent.show_admissible, corrupt=ws.corrupt)
        bar.close()
        if not demos:
            raise RuntimeError("the expert solved no task within warmstart.max_turns; "
                               "raise warmstart.max_turns or lower warmstart.epsilon")
    vocab_env = make_train()
    extra = list(getattr(vocab_env.unwrapped, "vocabulary", lambda: [])())
    phrases = list(getattr(vocab_env.unwrapped, "entity_phrases", lambda: [])())
    lm_texts = []
    if ws.enabled and ws.lm_epochs > 0:
        lm_corpus = getattr(vocab_env.unwrapped, "lm_corpus", None)
        if lm_corpus is None:
            raise ValueError(f"warmstart.lm_epochs > 0 but {type(vocab_env.unwrapped).__name__} "
                             "has no lm_corpus()")
        lm_texts = list(lm_corpus())
    vocab_env.close()
    from ..agents.parsing import INVALID_FORMAT_MESSAGE
    corpus = demo_texts(demos) + [cfg.agent.system_prompt, INVALID_FORMAT_MESSAGE]
    model, tok = build_model(cfg.model, corpus, extra, seed=cfg.seed, phrases=phrases)
    if lm_texts:
        rows = lm_rows(lm_texts, tok, ws.lm_row_tokens)
        secs = _supervised(model, rows, ws, ws.lm_epochs, tok.pad_token_id, cfg.seed, log,
                           "lm", "corpus LM", progress)
        log.log(0, "lm_done", {"rows": len(rows), "seconds": secs})
    if ws.enabled:
        prompter = ChatPrompter(tok, cfg.agent.system_prompt)
        rows = demo_rows(demos, prompter, tok, cfg.agent.action_format,
                         cfg.agent.max_context_tokens, ws.train_on_noise)
        secs = _supervised(model, rows, ws, ws.epochs, tok.pad_token_id, cfg.seed, log, "sft",
                           "warm-start SFT", progress)
        log.log(0, "sft_done", {"demos": len(demos), "rows": len(rows), "seconds": secs})
    save_model_dir(out / "warmstart", model, tok, {"phase": "warmstart"})
    return model, tok


def train(cfg: DictConfig, resume: bool = False, progress: bool = True) -> dict:
    """Runs the whole job; returns the summary also written to ``summary.json``."""
    _quiet_transformers()
    torch.set_num_threads(max(1, cfg.threads))
    _seed_everything(cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpts = CheckpointManager(out / "checkpoints", keep=cfg.checkpoint.keep)
    latest = ckpts.latest() if resume else None
    if not resume and (out / "metrics.jsonl").exists():
        (out / "metrics.jsonl").unlink()  # a fresh run starts a fresh log
    write_atomic_text(out / "config.yaml", OmegaConf.to_yaml(cfg))
    log = MetricsLogger(out / "metrics.jsonl", out / "tensorboard")
    t_start = time.time()

    summary: dict = {}
    if latest is not None:
        model, tok = load_pretrained(str(latest), cfg.model.dtype, cfg.model.device)
        state = ckpts.state(latest)
        start_step = int(state["step"])
        summary = state.get("summary", {})
    elif resume and (out / "warmstart" / "config.json").exists():
        model, tok = load_pretrained(str(out / "warmstart"), cfg.model.dtype, cfg.model.device)
        start_step = 0
    else:
        model, tok = _warmstart(cfg, out, log, progress)
        start_step = 0
    if "warmstart_eval" not in summary:
        summary["warmstart_eval"] = {}
        for split in cfg.env.eval_splits:
            m = evaluate_model(model, tok, cfg, split, progress)
            summary["warmstart_eval"][split] = m
            log.log(0, "eval", {"split": split, **m})
            print(format_report(f"warm-start [{split}]", m), flush=True)

    rl = cfg.rl
    opt = torch.optim.AdamW(model.parameters(), lr=rl.lr, weight_decay=rl.weight_decay)
    if latest is not None:
        ckpts.load_optimizer(latest, opt)
        ckpts.load_rng(latest)
    needs = credit_lib.requirements(rl.credit.name)
    ref = None
    if rl.kl_coef > 0 or "reference_scorer" in needs:
        ref, _ = load_pretrained(str(out / "warmstart"), cfg.model.dtype, cfg.model.device)
        ref.eval().requires_grad_(False)
    trainer = PolicyGradientTrainer(model, opt, rl, tok.pad_token_id,
                                    ref if rl.kl_coef > 0 else None, seed=cfg.seed)
    policy = HFPolicy(model, tok, max_batch_size=cfg.agent.max_batch_size)
    prompter = ChatPrompter(tok, cfg.agent.system_prompt)
    pool = EnvPool(env_factory(cfg, cfg.env.train_split))
    rcfg = rollout_config(cfg)
    credit_params = OmegaConf.to_container(rl.credit.params, resolve=True) or {}
    version = {"step": start_step}

    def brancher(points):  # exact-prefix continuations for branch-based credit
        return continue_from(policy, prompter, pool, points, rcfg, version["step"])

    credit_ctx = credit_context(needs, policy, model, ref, tok, credit_params, brancher)

    bar = tqdm(range(start_step, rl.steps), initial=start_step, total=rl.steps, desc="RL",
               disable=not progress)
    for step in bar:
        step_rng = np.random.default_rng([cfg.seed, step])
        policy.generator.manual_seed(int(step_rng.integers(2**62)))
        hi = rl.task_pool if rl.task_pool else 2**31 - 1
        seeds = step_rng.integers(0, hi, size=rl.tasks_per_step).tolist()
        t0 = time.time()
        version["step"] = step
        groups = rollout(policy, prompter, pool, seeds, rl.group_size, rcfg, policy_version=step)
        t_roll = time.time() - t0
        t_c = time.time()
        credits = credit_lib.assign_credit(rl.credit.name, groups, credit_params, credit_ctx)
        t_credit = time.time() - t_c
        t1 = time.time()
        upd = trainer.update(groups, credits)
        t_upd = time.time() - t1
        m = summarize(groups)
        rec = {"success_rate": m["success"], "mean_turns": m["mean_turns"],
               "invalid_action_rate": m["invalid_action_rate"],
               "format_error_rate": m["format_error_rate"], **upd,
               "rollout_s": t_roll, "update_s": t_upd, "credit_s": t_credit,
               "rollout_tok_per_s": upd.get("response_tokens", 0) / max(t_roll, 1e-9),
               "train_tok_per_s": upd.get("train_tokens", 0) / max(t_upd, 1e-9)}
        for c in credits:
            for k, v in c.metrics.items():
                rec[f"credit/{k}"] = rec.get(f"credit/{k}", 0.0) + v / len(credits)
        log.log(step + 1, "rl", rec)
        bar.set_postfix(succ=f"{m['success']:.2f}", turns=f"{m['mean_turns']:.1f}")
        done = step + 1
        if cfg.eval.every and done % cfg.eval.every == 0 and done < rl.steps:
            for split in cfg.env.eval_splits:
                em = evaluate_model(model, tok, cfg, split, progress)
                log.log(done, "eval", {"split": split, **em})
        if cfg.checkpoint.every and done % cfg.checkpoint.every == 0:
            ckpts.save(done, model, tok, opt, {"phase": "rl", "summary": summary})
    bar.close()

    summary["final_eval"] = {}
    for split in cfg.env.eval_splits:
        m = evaluate_model(model, tok, cfg, split, progress)
        summary["final_eval"][split] = m
        log.log(rl.steps, "eval", {"split": split, **m})
        print(format_report(f"final [{split}]", m), flush=True)
    save_model_dir(out / "final", model, tok, {"phase": "final", "step": rl.steps})
    summary["wall_seconds_this_run"] = time.time() - t_start
    write_atomic_text(out / "summary.json", json.dumps(summary, indent=1))
    log.close()
    try:
        png = plot_learning_curve(out / "metrics.jsonl", out / "learning_curve.png")
        summary["plot"] = str(png)
    except Exception as exc:  # plotting must never lose a finished run
        print(f"warning: could not plot the learning curve: {exc}")
    return summary


def evaluate_checkpoint(cfg: DictConfig, checkpoint: str, splits=None, progress: bool = True
                        ) -> dict:
    _quiet_transformers()
    torch.set_num_threads(max(1, cfg.threads))
    model, tok = load_pretrained(checkpoint, cfg.model.dtype, cfg.model.device)
    res = {}
    for split in splits or cfg.env.eval_splits:
        res[split] = evaluate_model(model, tok, cfg, split, progress)
        print(format_report(f"{checkpoint} [{split}]", res[split]), flush=True)
    return res
