import pytest

from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer, numbered_entities

pytestmark = pytest.mark.fast


def test_entities_are_single_tokens_and_round_trip():
    corpus = ["You arrive at cabinet 1. On the cabinet 1, you see a apple 12, and a mug 3.",
              "take from"]
    tok = build_tiny_tokenizer(corpus, ["apple", "mug", "cabinet"])
    text = "<action> take apple 12 from cabinet 1 </action>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<action>", "take", "apple 12", "from",
                                              "cabinet 1", "</action>"]
    assert tok.decode(ids) == text
    assert numbered_entities(corpus) == ["apple 12", "cabinet 1", "mug 3"]
    plain = build_tiny_tokenizer(corpus, fuse_entities=False)
    assert "apple" in plain.convert_ids_to_tokens(plain(text, add_special_tokens=False)["input_ids"])


def test_chat_template_and_model_shapes():
    tok = build_tiny_tokenizer(["hello world"])
    s = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                add_generation_prompt=True)
    assert s.strip().endswith("<|assistant|>")
    m = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, seed=1)
    m2 = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, seed=1)
    assert m.config.vocab_size == len(tok)
    assert all((a == b).all() for a, b in zip(m.parameters(), m2.parameters()))  # seeded


def test_env_phrases_fuse_into_single_tokens():
    tok = build_tiny_tokenizer(["where was kredas hufel born ?"], ["kredas", "hufel"],
                               phrases=["Kredas Hufel", "Cetiork Works", "single"])
    text = "where was Kredas Hufel born ? <answer> cetiork works </answer>"
    toks = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])
    assert "kredas hufel" in toks and "cetiork works" in toks and "single" not in toks
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text.lower()
