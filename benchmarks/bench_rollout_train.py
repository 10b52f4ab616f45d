"""Rollout tokens/s (generated tokens) and train tokens/s (forward+backward) for the
embedded tiny model on CPU, plus the KV-session speed-up over re-sending the
full context each turn.
"""

from __future__ import annotations

import argparse
import time

import torch

from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
from turngym.agents.prompting import ChatPrompter
from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
from turngym.config import load_config
from turngym.credit import assign_credit
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.demos import collect_demos, demo_texts
from turngym.trainers.pipeline import env_factory
from turngym.trainers.update import PolicyGradientTrainer


class _NoSession:
    def __init__(self, p):
        self.p, self.stop_token_ids = p, p.stop_token_ids

    def generate(self, prompts, params):
        return self.p.generate(prompts, params)

    def decode(self, ids):
        return self.p.decode(ids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--turns", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = load_config("quickstart")
    make = env_factory(cfg, "train")
    demos = collect_demos(make, 200, 0.1, 0, 30)
    tok = build_tiny_tokenizer(demo_texts(demos), TextWorldEnv.vocabulary())
    model = build_tiny_model(tok, cfg.model.hidden_size, cfg.model.num_layers, cfg.model.num_heads)
    prompter = ChatPrompter(tok, cfg.agent.system_prompt)
    pol = HFPolicy(model, tok, generator_seed=0)
    rc = RolloutConfig(max_turns=a.turns, max_new_tokens=cfg.agent.max_new_tokens)
    seeds = list(range(a.tasks))
    results = {}
    for name, p in (("kv-session", pol), ("full-context", _NoSession(pol))):
        t0 = time.perf_counter()
        groups = rollout(p, prompter, EnvPool(make), seeds, a.group, rc)
        dt = time.perf_counter() - t0
        gen = sum(len(t.response_ids) for g in groups for tr in g for t in tr.turns)
        results[name] = (gen / dt, dt)
        print(f"rollout [{name}]: {gen / dt:,.0f} generated tok/s "
              f"({gen} tokens, {a.tasks * a.group} episodes, {dt:.2f}s)")
    print(f"kv-session speed-up: {results['kv-session'][0] / results['full-context'][0]:.2f}x")
    # give the batch non-zero advantages so the update does real work
    credits = assign_credit("grpo", groups)
    credits = [type(c)(tuple(tuple(1.0 if (i % 2) else -1.0 for _ in adv)
                             for i, adv in enumerate(c.turn_advantages))) for c in credits]
    trainer = PolicyGradientTrainer(model, torch.optim.AdamW(model.parameters(), 1e-4), cfg.rl,
                                    tok.pad_token_id)
    trainer.update(groups, credits)  # warm-up
    t0 = time.perf_counter()
    stats = trainer.update(groups, credits)
    dt = time.perf_counter() - t0
    print(f"train: {stats['train_tokens'] / dt:,.0f} tok/s forward+backward "
          f"({int(stats['train_tokens'])} tokens, recompute_logprobs={cfg.rl.recompute_logprobs}, "
          f"{dt:.2f}s)")


if __name__ == "__main__":
    main()
