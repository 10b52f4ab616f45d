"""Transformers policy backend (CPU or a single GPU).

Sampling is a small explicit loop over a KV cache instead of ``generate`` so the
returned log-probs are exactly those of the distribution sampled from
(temperature and top-p included) and stop handling is per row.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .constraints import ActionChoices
from .policy import Sample, SamplingParams, decode_response, stop_ids_for
from .numerics import (autocast, cache_kwarg, cache_of, growing_cache, right_pad,
                       sequence_logprobs)


def _filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop = probs.cumsum(-1) - probs > top_p  # keep the first token always
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


class HFPolicy:
    """A ``transformers`` causal LM behind the :class:`~turngym.agents.policy.Policy` API."""

    supports_choices = True  # SupportsConstrainedDecoding

    def __init__(self, model, tokenizer, stop_token_ids: Sequence[int] | None = None,
                 max_batch_size: int = 64, generator_seed: int | None = None,
                 precision: str | None = None):
        self.model = model
        self.precision = precision  # autocast dtype for sampling/scoring forwards
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_ids_for(tokenizer, stop_token_ids,
                                           getattr(model, "generation_config", None))
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_token_ids[0])
        self.max_batch_size = max_batch_size
        # on the model's device: sampling on a GPU then never copies [B, vocab]
        # probabilities to the host for every token
        self.generator = torch.Generator(device=self.device)
        if generator_seed is not None:
            self.generator.manual_seed(generator_seed)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def decode(self, token_ids: Sequence[int]) -> str:
        return decode_response(self.tokenizer, self.stop_token_ids, token_ids)

    # ---------------------------------------------------------------- sampling
    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 choices: Sequence[ActionChoices | None] | None = None) -> list[Sample]:
        """One continuation per prompt; ``choices[i]`` (constrained decoding) restricts
        prompt i's response to those token sequences."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if choices is not None and len(choices) != len(prompts):
            raise ValueError("one choices entry (or None) per prompt")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Sample | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.max_batch_size):
                idx = order[start:start + self.max_batch_size]
                sub = None if choices is None else [choices[i] for i in idx]
                for i, s in zip(idx, self._generate_chunk([prompts[i] for i in idx], params,
                                                          sub)):
                    out[i] = s
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

    def _generate_chunk(self, prompts, params: SamplingParams, choices=None) -> list[Sample]:
        session = KVSession(self, len(prompts))
        return session.generate(list(range(len(prompts))), prompts, params, choices=choices)

    def open_session(self, num_rows: int) -> "KVSession":
        """A multi-turn generation session that keeps each row's KV cache across turns,
        so a turn only prefills the new observation tokens (prefix caching)."""
        return KVSession(self, num_rows)

    # ---------------------------------------------------------------- scoring
    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return sequence_logprobs(self.model, sequences, self.pad_id,
                                 budget=self.max_batch_size * max(len(s) for s in sequences)
                                 if sequences else 1, precision=self.precision)


class KVSession:
    """Per-row KV cache kept across turns of a batched multi-turn rollout.

    Row i's cache always holds exactly its context so far minus the last sampled
    token (fed at the start of the next turn).  New tokens of different lengths
    are left-padded into one forward; padding gets attention-mask 0 and does not
    advance the row's position ids, so holes in the cache are invisible.
    """

    def __init__(self, policy: HFPolicy, num_rows: int):
        self.policy = policy
        self.model = policy.model
        self.device = policy.device
        self.B = num_rows
        self.cache = growing_cache(self.model)
        self.mask = torch.zeros((num_rows, 0), dtype=torch.long, device=self.device)
        self.pos = torch.zeros(num_rows, dtype=torch.long, device=self.device)
        self.unfed: list[list[int]] = [[] for _ in range(num_rows)]
        self._ckw = cache_kwarg(self.model)

    def _forward(self, ids: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
        pos = self.pos.unsqueeze(1) + new_mask.cumsum(-1) - 1
        pos = pos.clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        kw = {self._ckw: self.cache} if self.cache is not None else {}
        with autocast(self.policy.precision, self.device):
            res = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                             use_cache=True, logits_to_keep=1, **kw)
        self.cache = cache_of(res)
        self.pos = self.pos + new_mask.sum(-1)
        return res.logits[:, -1, :].float()

    @torch.no_grad()
    def generate(self, rows: Sequence[int], new_tokens: Sequence[Sequence[int]],
                 params: SamplingParams, max_new: Sequence[int] | None = None,
                 choices: Sequence[ActionChoices | None] | None = None) -> list[Sample]:
        """Appends ``new_tokens[k]`` to row ``rows[k]`` and samples a continuation for each
        (at most ``max_new[k]`` tokens when given, else ``params.max_new_tokens``;
        restricted to ``choices[k]``'s sequences when that is given)."""
        pad = self.policy.pad_id
        chunks = [[] for _ in range(self.B)]
        for r, toks in zip(rows, new_tokens):
            chunks[r] = self.unfed[r] + list(toks)
            if not chunks[r]:
                raise ValueError("a row needs at least one new token to generate from")
        width = max(len(c) for c in chunks)
        ids = torch.full((self.B, width), pad, dtype=torch.long)
        new_mask = torch.zeros((self.B, width), dtype=torch.long)
        for r, c in enumerate(chunks):
            if c:
                ids[r, width - len(c):] = torch.tensor(c, dtype=torch.long)
                new_mask[r, width - len(c):] = 1
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self._forward(ids.to(self.device), new_mask.to(self.device))
            return self._decode(rows, logits, params, max_new, choices)
        finally:
            self.model.train(was_training)

    def _decode(self, rows, logits, params: SamplingParams, max_new=None, choices=None
                ) -> list[Sample]:
        device, pad = self.device, self.policy.pad_id
        stop = torch.tensor(self.policy.stop_token_ids, device=device)
        live = torch.zeros(self.B, dtype=torch.bool, device=device)
        live[list(rows)] = True
        limit = torch.full((self.B,), params.max_new_tokens, dtype=torch.long, device=device)
        if max_new is not None:
            limit[list(rows)] = torch.tensor([max(1, min(int(m), params.max_new_tokens))
                                              for m in max_new], device=device)
        toks, lps, alive = [], [], []
        gen = self.policy.generator
        restrict = _Restriction(rows, choices) if choices is not None else None
        for step in range(params.max_new_tokens):
            if restrict is not None:
                logits = restrict.mask(logits, live)
            if params.greedy:
                lp_all = torch.log_softmax(logits, dim=-1)
                tok = lp_all.argmax(-1)
            else:
                scaled = _filter_top_p(logits / params.temperature, params.top_p)
                lp_all = torch.log_softmax(scaled, dim=-1)
                tok = torch.multinomial(lp_all.exp(), 1, generator=gen).squeeze(-1)
            tok = torch.where(live, tok, torch.full_like(tok, pad))
            if restrict is not None:
                restrict.advance(tok, live)
            toks.append(tok)
            lps.append(lp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
            alive.append(live.clone())
            live = live & ~torch.isin(tok, stop) & (step + 1 < limit)
            if not bool(live.any()) or step + 1 == params.max_new_tokens:
                break
            # feed the token of rows still going; finished rows get masked padding
            logits = self._forward(torch.where(live, tok, torch.full_like(tok, pad)).unsqueeze(1),
                                   live.long().unsqueeze(1))
        tok_mat = torch.stack(toks, 1).cpu()
        lp_mat = torch.stack(lps, 1).cpu()
        alive_mat = torch.stack(alive, 1).cpu()
        stops = set(self.policy.stop_token_ids)
        out = []
        for r in rows:
            n = int(alive_mat[r].sum())
            ids = tok_mat[r, :n].tolist()
            self.unfed[r] = [ids[-1]]
            out.append(Sample(tuple(ids), tuple(lp_mat[r, :n].tolist()), ids[-1] in stops))
        return out


class _Restriction:
    """Per-row prefix tries of a constrained decode: at each step the logits of tokens
    that continue no allowed sequence are set to -inf (rows without choices untouched)."""

    def __init__(self, rows: Sequence[int], choices: Sequence[ActionChoices | None]):
        if len(choices) != len(rows):
            raise ValueError("one choices entry (or None) per generated row")
        self.by_row = {int(r): c for r, c in zip(rows, choices) if c is not None}
        self.prefix: dict[int, list[int]] = {r: [] for r in self.by_row}

    def mask(self, logits: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        if not self.by_row:
            return logits
        alive = live.tolist()
        keep = torch.ones(logits.shape, dtype=torch.bool)
        for r, c in self.by_row.items():
            if alive[r]:
                nxt = c.allowed_next(self.prefix[r])
                if not nxt:  # every allowed sequence ends with a stop token, which ends the row
                    raise RuntimeError(f"row {r}: constrained response ran past its choices")
                keep[r] = False
                keep[r, nxt] = True
        return logits.masked_fill(~keep.to(logits.device), float("-inf"))

    def advance(self, tok: torch.Tensor, live: torch.Tensor) -> None:
        ids, alive = tok.tolist(), live.tolist()
        for r in self.by_row:
            if alive[r]:
                self.prefix[r].append(int(ids[r]))
