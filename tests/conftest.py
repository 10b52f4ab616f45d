import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_stack():
    """A tiny tokenizer/model fit on real text-world text (session-shared, read-only)."""
    import torch

    from turngym.agents.prompting import ChatPrompter
    from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
    from turngym.envs.textworld import TextWorldEnv
    from turngym.envs.textworld.engine import World
    from turngym.envs.textworld.generator import WorldConfig, sample_task
    from turngym.envs.textworld.oracle import solve

    torch.set_num_threads(1)
    texts = []
    for i in range(30):
        w = World(sample_task(WorldConfig(), "train", i))
        texts.append(w.intro())
        for a in solve(w):
            texts.append(a)
    tok = build_tiny_tokenizer(texts, TextWorldEnv.vocabulary())
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    prompter = ChatPrompter(tok, "You are a household agent.")
    return tok, model, prompter


@pytest.fixture(scope="session", autouse=True)
def _index_cache(tmp_path_factory):
    """Search indexes built by tests go to a throwaway cache, never ~/.cache."""
    old = os.environ.get("TURNGYM_CACHE")
    os.environ["TURNGYM_CACHE"] = str(tmp_path_factory.mktemp("turngym-cache"))
    yield
    if old is None:
        os.environ.pop("TURNGYM_CACHE", None)
    else:
        os.environ["TURNGYM_CACHE"] = old


# a small wiki (about 2.3k passages) for tests that build a dense index
SMALL_WIKI = {"kind": "wiki", "seed": 1, "num_countries": 8, "num_cities": 60, "num_orgs": 150,
              "num_people": 600, "questions_per_template": 40}


def response_scores(model, rows, pad_id, temperature=1.0):
    """The trainer's log-probs (``score_rows``) of every trained response token of
    ``rows``, flattened in row order."""
    import torch

    from turngym.trainers.update import score_rows
    out = []
    for r, sc in zip(rows, score_rows(model, rows, pad_id, 4096, temperature=temperature)):
        out += [x for x, m in zip(sc, r.mask) if m]
    return torch.tensor(out)


def first_ppo_step(tok, model, groups, temperature):
    """Stats of one PPO update of a copy of the tiny ``model`` on ``groups``, with the
    rollouts' own log-probs as the old ones (a vanishing lr, clip range 0.01, advantages
    alternating -1/+1 across each group): its clipfrac says how far the trainer's scores
    are from the sampler's."""
    import torch

    from turngym.agents.tiny import build_tiny_model
    from turngym.config import load_config
    from turngym.trainers.update import PolicyGradientTrainer
    from turngym.types import CreditAssignment
    m = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    m.load_state_dict(model.state_dict())
    cfg = load_config("quickstart", ["rl.lr=1e-9", "rl.recompute_logprobs=false",
                                     "rl.clip_low=0.01", "rl.clip_high=0.01"]).rl
    trainer = PolicyGradientTrainer(m, torch.optim.AdamW(m.parameters(), lr=cfg.lr), cfg,
                                    tok.pad_token_id, temperature=temperature)
    credits = [CreditAssignment(tuple((1.0 if i % 2 else -1.0,) * t.num_turns
                                      for i, t in enumerate(g))) for g in groups]
    return trainer.update(groups, credits)
