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
