"""Constrained action decoding inside a vLLM engine (``agent.constrain_actions`` with
``agent.backend: vllm``).

A vLLM logits processor, loaded into the engine by its qualified name
(``vllm_backend.PROCESSOR``), keeps for each request only the tokens that continue one of the
request's allowed token sequences -- the same prefix trie the transformers sampler
walks (:mod:`turngym.agents.constraints`).  The sequences travel with the request in
``SamplingParams.extra_args[CHOICES_ARG]`` (lists of token ids, each ending with its
stop token); requests without them are left alone.  The mask is applied before
temperature and top-p, so the engine's processed log-probs
(``logprobs_mode=processed_logprobs``) are those of the restricted distribution, which
is what the trainer scores (``Turn.choices`` -> ``agents.numerics.restricted``).

vLLM 0.32 has two model runners with two processor interfaces; this one implements the
V1 runner's (batch indices, ``update_state``), and the backend starts a constrained engine
on that runner (``VLLM_USE_V2_MODEL_RUNNER=0``; Model Runner V2 needs Triton on a GPU, so
its interface cannot be exercised on the CPU build the tests run).

This module imports vLLM; only the engine loads it (by name: ``vllm_backend.PROCESSOR``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from .constraints import ActionChoices
from .vllm_backend import CHOICES_ARG


def _sequences_of(params):
    """The request's allowed token sequences (``None``: an unconstrained request)."""
    return (getattr(params, "extra_args", None) or {}).get(CHOICES_ARG)


def _choices_of(params) -> ActionChoices | None:
    seqs = _sequences_of(params)
    if seqs is None:
        return None
    return ActionChoices(tuple(tuple(int(t) for t in s) for s in seqs),
                         tuple(str(i) for i in range(len(seqs))))


def mask_rows(logits: torch.Tensor, rows: Sequence[int],
              choices: Sequence[ActionChoices], prefixes: Sequence[Sequence[int]]) -> None:
    """In place: row ``rows[i]`` keeps only the tokens ``choices[i]`` allows after
    ``prefixes[i]`` (the response's tokens so far; :meth:`ActionChoices.engine_next`)."""
    if not rows:
        return
    keep = torch.zeros(len(rows), logits.shape[-1], dtype=torch.bool)
    for i, (c, prefix) in enumerate(zip(choices, prefixes)):
        keep[i, c.engine_next(prefix)] = True
    index = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, index)
    sub.masked_fill_(~keep.to(logits.device), float("-inf"))
    logits.index_copy_(0, index, sub)


class ChoiceMask(LogitsProcessor):
    """The logits processor (vLLM's V1-runner interface)."""

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        # batch index -> (choices, the request's running output-token list, which vLLM
        # keeps current: the response's tokens so far)
        self.by_index: dict[int, tuple[ActionChoices, list[int]]] = {}

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        seqs = _sequences_of(sampling_params)
        if seqs is None:
            return
        if (not isinstance(seqs, list) or not seqs
                or not all(isinstance(s, list) and s and all(isinstance(t, int) for t in s)
                           for s in seqs)):
            raise ValueError(f"extra_args[{CHOICES_ARG!r}] must be a non-empty list of "
                             "non-empty lists of token ids")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes greedy picks too

    def update_state(self, batch_update) -> None:
        def new_state(params, _prompt_ids, output_ids):
            c = _choices_of(params)
            return None if c is None else (c, output_ids)

        process_dict_updates(self.by_index, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        items = sorted(self.by_index.items())
        mask_rows(logits, [i for i, _ in items], [c for _, (c, _) in items],
                  [out for _, (_, out) in items])
        return logits
