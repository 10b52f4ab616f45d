"""Warm start: an optional language-modelling pass over the env's own text, then SFT
on (noise-injected) oracle demonstrations.  Runs before RL, on rank 0 alone."""

from __future__ import annotations

import random
import time
from pathlib import Path

from omegaconf import DictConfig
from tqdm.auto import tqdm

from ..agents.factory import build_model
from ..agents.hf_backend import HFPolicy
from ..agents.parsing import INVALID_FORMAT_MESSAGE
from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, rollout
from ..envs.base import HasEntityPhrases, HasLMCorpus, HasRenaming, HasVocabulary
from .checkpoint import save_model_dir
from .demos import collect_demos, demo_rows, demo_texts, lm_rows, renamed_demos, rollin_demos
from .metrics import MetricsLogger
from .runtime import env_factory, rollout_config
from .sft import sft_train


def _supervised(model, rows, ws, epochs: int, pad_id: int, seed: int, log: MetricsLogger,
                phase: str, desc: str, progress: bool, precision: str | None = None) -> float:
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
              weight_decay=ws.weight_decay, warmup_steps=ws.warmup_steps, on_step=on_step,
              precision=precision)
    bar.close()
    return time.time() - t0


def _learner_rollouts(model, tok, prompter: ChatPrompter, cfg: DictConfig, make_env,
                      num: int, progress: bool) -> list[tuple[int, list[str], bool]]:
    """``num`` training episodes of the current model with the training sampler:
    (task seed, action texts, won) each."""
    rng = random.Random(f"rollin-tasks-{cfg.seed}")
    seeds = [rng.randrange(2**31 - 1) for _ in range(num)]
    policy = HFPolicy(model, tok, max_batch_size=cfg.agent.max_batch_size,
                      generator_seed=cfg.seed + 104729, precision=cfg.model.autocast)
    pool, rcfg, out = EnvPool(make_env), rollout_config(cfg), []
    chunk = max(1, cfg.agent.max_batch_size)
    bar = tqdm(total=num, desc="learner roll-in", leave=False, disable=not progress)
    was_training = model.training
    model.eval()
    for s in range(0, num, chunk):
        for g in rollout(policy, prompter, pool, seeds[s:s + chunk], 1, rcfg):
            for t in g:
                out.append((int(t.info["task_seed"]), [u.action_text for u in t.turns],
                            bool(t.success)))
        bar.update(len(seeds[s:s + chunk]))
    bar.close()
    model.train(was_training)
    return out


def _rollin_round(model, tok, prompter: ChatPrompter, demos: list, cfg: DictConfig, make_env,
                  log: MetricsLogger, progress: bool) -> None:
    """``warmstart.rollin``: learner roll-in, expert roll-out demos, one more SFT phase."""
    ws = cfg.warmstart
    t0 = time.time()
    played = _learner_rollouts(model, tok, prompter, cfg, make_env, ws.rollin, progress)
    fresh = rollin_demos(make_env, played, cfg.agent.max_turns, cfg.seed,
                         rollout_config(cfg).view)
    if not fresh:
        raise RuntimeError("warmstart.rollin: the expert finished none of the learner's "
                           "episodes within agent.max_turns")
    old = random.Random(f"rollin-mix-{cfg.seed}").sample(demos, min(len(demos), len(fresh)))
    rows = demo_rows(fresh + old, prompter, tok, cfg.agent.action_format,
                     cfg.agent.max_context_tokens, ws.train_on_noise, cfg.agent.context_mode,
                     cfg.agent.window_turns)
    secs = _supervised(model, rows, ws, ws.rollin_epochs, tok.pad_token_id, cfg.seed, log,
                       "rollin", "roll-in SFT", progress, cfg.model.autocast)
    log.log(0, "rollin_done", {
        "episodes": len(played), "learner_success": sum(w for _, _, w in played) / len(played),
        "demos": len(fresh), "mixed_demos": len(old), "rows": len(rows), "sft_seconds": secs,
        "seconds": time.time() - t0})


def _env_words(env) -> tuple[list[str], list[str], list[str]]:
    """(vocabulary, entity phrases, LM corpus) an env offers (each optional)."""
    e = env.unwrapped
    vocab = list(e.vocabulary()) if isinstance(e, HasVocabulary) else []
    phrases = list(e.entity_phrases()) if isinstance(e, HasEntityPhrases) else []
    corpus = list(e.lm_corpus()) if isinstance(e, HasLMCorpus) else []
    return vocab, phrases, corpus


def run_warmstart(cfg: DictConfig, out: Path, log: MetricsLogger, progress: bool = True):
    """Demonstrations -> model (a tiny model's tokenizer is fit on them) -> optional corpus
    LM pass -> SFT; saved to ``out/warmstart`` (the KL/TRACE reference)."""
    ws = cfg.warmstart
    make_train = env_factory(cfg, cfg.env.train_split)
    demos = []
    if ws.enabled or cfg.model.kind == "tiny":
        n = ws.num_demos if ws.enabled else min(ws.num_demos, 200)
        bar = tqdm(total=n, desc="collecting demos", leave=False, disable=not progress)
        demos = collect_demos(make_train, n, ws.epsilon, cfg.seed, cfg.agent.max_turns,
                              progress=bar.update, view=rollout_config(cfg).view,
                              corrupt=ws.corrupt)
        bar.close()
        if not demos:
            raise RuntimeError(f"the expert solved no task within agent.max_turns="
                               f"{cfg.agent.max_turns}; raise it or lower warmstart.epsilon")
    vocab_env = make_train()
    extra, phrases, lm_texts = _env_words(vocab_env)
    vocab_env.close()
    if ws.enabled and ws.rename > 0:
        if not isinstance(vocab_env.unwrapped, HasRenaming):
            raise ValueError(f"warmstart.rename > 0 but {type(vocab_env.unwrapped).__name__} "
                             "offers no renamer() (HasRenaming)")
        plain = demos
        demos = renamed_demos(demos, vocab_env.unwrapped.renamer, ws.rename, cfg.seed)
        n_renamed = sum(a is not b for a, b in zip(plain, demos))
    else:
        n_renamed = 0
    wants_lm = ws.enabled and (ws.lm_epochs > 0 or ws.lm_mix)
    if wants_lm and not lm_texts:
        raise ValueError(f"warmstart.lm_epochs > 0 or warmstart.lm_mix but "
                         f"{type(vocab_env.unwrapped).__name__} offers no lm_corpus() "
                         "(HasLMCorpus)")
    if not wants_lm:
        lm_texts = []
    corpus = demo_texts(demos) + [cfg.agent.system_prompt, INVALID_FORMAT_MESSAGE]
    model, tok = build_model(cfg.model, corpus, extra, seed=cfg.seed, phrases=phrases)
    mixed = lm_rows(lm_texts, tok, ws.lm_row_tokens) if lm_texts and ws.lm_mix else []
    if lm_texts and not ws.lm_mix:
        rows = lm_rows(lm_texts, tok, ws.lm_row_tokens)
        secs = _supervised(model, rows, ws, ws.lm_epochs, tok.pad_token_id, cfg.seed, log,
                           "lm", "corpus LM", progress, cfg.model.autocast)
        log.log(0, "lm_done", {"rows": len(rows), "seconds": secs})
    if ws.enabled:
        prompter = ChatPrompter(tok, cfg.agent.system_prompt)
        rows = demo_rows(demos, prompter, tok, cfg.agent.action_format,
                         cfg.agent.max_context_tokens, ws.train_on_noise,
                         cfg.agent.context_mode, cfg.agent.window_turns)
        if not rows:
            raise RuntimeError("no demonstration fits agent.max_context_tokens="
                               f"{cfg.agent.max_context_tokens}; raise it")
        rows = rows + mixed
        secs = _supervised(model, rows, ws, ws.epochs, tok.pad_token_id, cfg.seed, log, "sft",
                           "warm-start SFT", progress, cfg.model.autocast)
        log.log(0, "sft_done", {"demos": len(demos), "rows": len(rows), "lm_rows": len(mixed),
                                "renamed": n_renamed, "seconds": secs})
        if ws.rollin > 0:
            _rollin_round(model, tok, prompter, demos, cfg, make_train, log, progress)
    save_model_dir(out / "warmstart", model, tok, {"phase": "warmstart"})
    return model, tok
