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
