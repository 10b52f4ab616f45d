"""A tiny randomly-initialised Llama and a word-level tokenizer built in code.

This is the embedded CPU default: no download, trains in minutes on two cores.
The tokenizer is fit on text the env actually produces, so every observation
word is one token, and it carries a chat template so the same prompting code
serves it and real chat models.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

import torch
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<pad>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
TAGS = ["<think>", "</think>", "<action>", "</action>", "<answer>", "</answer>",
        "<search>", "</search>", "<information>", "</information>",
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}"
    "{% if m['role'] == 'assistant' %} <|end|>{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


_ENTITY = re.compile(r"\b([a-z]+ \d{1,2})\b")


def numbered_entities(corpus: Iterable[str], min_count: int = 1) -> list[str]:
    """``word N`` phrases ("cabinet 1", "apple 2") found in ``corpus``."""
    counts: Counter = Counter()
    for text in corpus:
        counts.update(_ENTITY.findall(text.lower()))
    return sorted(p for p, c in counts.items() if c >= min_count)


def build_tiny_tokenizer(corpus: Iterable[str], extra_words: Iterable[str] = (),
                         fuse_entities: bool = True, phrases: Iterable[str] = ()
                         ) -> PreTrainedTokenizerFast:
    """Word-level tokenizer (lower-cased, punctuation split) fit on ``corpus``.

    With ``fuse_entities`` every numbered entity of the corpus ("cabinet 1") is one
    token, so naming an object is copying one token instead of a word and a
    number: a large help to a tiny model, irrelevant to real tokenizers.  ``phrases``
    (an env's multi-word entity names, e.g. "kredas hufel") are fused the same way.
    """
    corpus = list(corpus)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = [str(i) for i in range(100)] + list(extra_words)
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL, min_frequency=1)
    tok.train_from_iterator(corpus + [" ".join(words)], trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    if fuse_entities:
        extra = [f"{w} {i}" for w in extra_words if w.isalpha() for i in range(1, 10)]
        fused = sorted(set(numbered_entities(corpus)) | set(extra)
                       | {p.lower() for p in phrases if " " in p.strip()})
        tok.add_tokens([AddedToken(p, normalized=True, special=False, single_word=True)
                        for p in fused])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<|end|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL[2:5]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(tokenizer, hidden_size: int = 128, num_layers: int = 3, num_heads: int = 4,
                     intermediate_size: int | None = None, max_positions: int = 2048,
                     seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised small Llama sized to the tokenizer."""
    if hidden_size % num_heads:
        raise ValueError("hidden_size must be divisible by num_heads")
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, rms_norm_eps=1e-5, attention_dropout=0.0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model
