"""Gold-answer scoring at many points of a trajectory in one forward pass.

IGPO and TRACE need ``log p(gold answer | context up to boundary k)`` for every
turn boundary k of a trajectory.  Done naively that is one forward per boundary
over an ever longer prefix (O(T * L) tokens).  Here the whole trajectory is run
once and every boundary's answer is *packed* after it::

    [ trajectory tokens S (length L) ][ A @ b_0 ][ A @ b_1 ] ... [ A @ b_{K-1} ]

in two forwards: S alone (causal, its KV cache kept), then all answer blocks at
once against that cache under a block attention mask: the block for boundary
b_k sees ``S[:b_k]`` and itself (causally), nothing else, and its position ids
continue from ``b_k``.  Each block thus computes exactly what a separate forward
over ``S[:b_k] + A`` would (tested to 1e-5 against the naive computation), at
the cost of one causal forward of S plus K*|A| query tokens instead of
sum_k (b_k + |A|) tokens.  The first answer token's log-prob comes from S's own
logit at ``b_k - 1``; only positions that predict answer tokens are projected
onto the vocabulary.

Token-in-token-out: the trajectory is scored as the ids it was sampled as; only
the gold answer text is tokenised (once, cached).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..agents.constraints import sequence_restriction
from ..agents.numerics import autocast, cache_kwarg, cache_of, sequence_entropies
from ..types import Trajectory

DEFAULT_ANSWER_TEMPLATE = "<answer> {answer} </answer>"


def response_starts(traj: Trajectory) -> list[int]:
    """Token index where each turn's response begins in ``token_ids()`` (full history)."""
    return [s for s, _ in traj.response_spans()]


def turn_contexts(traj: Trajectory) -> list[tuple[tuple[int, ...], list[int], list[int]]]:
    """(sequence, positions, turns): where to score "the context turn t acted in" -- one
    sequence with every turn's response start (full history) or each turn's own prompt
    (window mode)."""
    out = []
    if traj.num_turns == 0:
        return out
    for sq in traj.sequences():
        out.append((sq.ids, [a for a, _ in sq.spans], list(sq.turns)))
    return out


def gold_answers(traj: Trajectory) -> list[str]:
    """Gold answers a QA env put in the reset info (``gold_answer``: str or list)."""
    g = traj.info.get("gold_answer")
    if g is None:
        raise KeyError(f"trajectory of task {traj.task_id!r} has no 'gold_answer' in its info; "
                       "answer-scoring credit needs a QA env (search QA, tool tasks)")
    return [g] if isinstance(g, str) else [str(x) for x in g]


@dataclass
class GoldScorer:
    """Scores gold answers at trajectory boundaries with ``model`` (policy or frozen reference).

    ``answer_template`` formats the answer as the agent would write it, so the
    score is that of the policy *answering* with the gold text at that point.
    """

    model: torch.nn.Module
    tokenizer: object
    answer_template: str = DEFAULT_ANSWER_TEMPLATE
    append_eos: bool = False
    max_batch_tokens: int = 16384
    precision: str | None = None  # autocast dtype (model.autocast), as the trainer uses
    _cache: dict = field(default_factory=dict, repr=False)

    def answer_ids(self, answer: str) -> list[int]:
        if answer not in self._cache:
            text = self.answer_template.format(answer=answer)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if self.append_eos and self.tokenizer.eos_token_id is not None:
                ids.append(int(self.tokenizer.eos_token_id))
            if not ids:
                raise ValueError(f"answer {answer!r} tokenises to nothing")
            self._cache[answer] = ids
        return self._cache[answer]

    def answer_mask(self, answer: str) -> np.ndarray:
        """Which tokens of ``answer_ids(answer)`` belong to the gold answer itself (not to
        the template's tags), from the tokenizer's character offsets; all True when the
        tokenizer gives no offsets."""
        ids = self.answer_ids(answer)
        key = ("mask", answer)
        if key not in self._cache:
            text = self.answer_template.format(answer=answer)
            start = len(self.answer_template.split("{answer}")[0])
            end = start + len(answer)
            try:
                enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
                spans = list(enc["offset_mapping"])
                mask = [a < end and b > start for a, b in spans]
            except (NotImplementedError, KeyError, TypeError):  # slow tokenizers
                mask = [True] * len(ids)
            mask += [False] * (len(ids) - len(mask))  # an appended eos is template
            self._cache[key] = np.array(mask if any(mask) else [True] * len(ids), dtype=bool)
        return self._cache[key]

    def turn_start_scores(self, trajs: Sequence[Trajectory]) -> list[list[list[np.ndarray]]]:
        """``out[i][t][j]``: log-probs of gold answer j's tokens in the context trajectory i
        acted in at turn t (before its response), in either context mode."""
        seqs, positions, answers, where = [], [], [], []
        for i, tr in enumerate(trajs):
            gold = gold_answers(tr)
            for seq, pos, turns in turn_contexts(tr):
                seqs.append(seq)
                positions.append(pos)
                answers.append(gold)
                where.append((i, turns))
        raw = self.score(seqs, positions, answers)
        out: list[list] = [[None] * tr.num_turns for tr in trajs]
        for (i, turns), per_k in zip(where, raw):
            for t, v in zip(turns, per_k):
                out[i][t] = v
        return out

    @torch.no_grad()
    def score(self, seqs: Sequence[Sequence[int]], positions: Sequence[Sequence[int]],
              answers: Sequence[Sequence[str]]) -> list[list[list[np.ndarray]]]:
        """``out[i][k][j]``: log-probs of answer j's tokens after ``seqs[i][:positions[i][k]]``
        (one packed forward per sequence, batched)."""
        rows = []
        for seq, pos, ans in zip(seqs, positions, answers):
            seq = list(seq)
            for p in pos:
                if not 0 < p <= len(seq):
                    raise ValueError(f"boundary {p} outside a trajectory of {len(seq)} tokens")
            rows.append((seq, list(pos), [self.answer_ids(a) for a in ans]))
        out: list = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: -_packed_len(rows[i]))
        batch: list[int] = []
        width = 0
        for i in order:
            n = _packed_len(rows[i])
            if batch and max(width, n) * (len(batch) + 1) > self.max_batch_tokens:
                self._run([rows[j] for j in batch], batch, out)
                batch, width = [], 0
            batch.append(i)
            width = max(width, n)
        if batch:
            self._run([rows[j] for j in batch], batch, out)
        return out

    def _run(self, rows, index, out) -> None:
        """Two forwards: the trajectories alone (causal, KV cache kept; logits only at
        the positions predicting a first answer token), then every answer block at once
        against that cache under a block mask."""
        model = self.model
        device = next(model.parameters()).device
        B = len(rows)
        Ls = [len(seq) for seq, _, _ in rows]
        Lmax = max(Ls)
        ids = torch.zeros((B, Lmax), dtype=torch.long)
        mask2d = torch.zeros((B, Lmax), dtype=torch.long)
        for b, (seq, _, _) in enumerate(rows):
            ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask2d[b, : len(seq)] = 1
        # answer blocks: (k, j, start in the block area, length, boundary)
        blocks, Q = [], 0
        for seq, positions, answers in rows:
            spans, cur = [], 0
            for k, p in enumerate(positions):
                for j, a in enumerate(answers):
                    spans.append((k, j, cur, len(a), p))
                    cur += len(a)
            blocks.append(spans)
            Q = max(Q, cur)
        first = sorted({p - 1 for spans in blocks for *_, p in spans})
        keep1 = torch.tensor(first, dtype=torch.long)
        col1 = torch.full((Lmax,), -1, dtype=torch.long)
        col1[keep1] = torch.arange(len(first))
        bids = torch.zeros((B, Q), dtype=torch.long)
        bpos = torch.zeros((B, Q), dtype=torch.long)
        allow = torch.zeros((B, Q, Lmax + Q), dtype=torch.bool)
        for b, (spans, (_, _, answers)) in enumerate(zip(blocks, rows)):
            for k, j, st, m, p in spans:
                bids[b, st:st + m] = torch.tensor(answers[j], dtype=torch.long)
                bpos[b, st:st + m] = torch.arange(p, p + m)
                allow[b, st:st + m, :p] = True
                allow[b, st:st + m, Lmax + st:Lmax + st + m] = torch.tril(
                    torch.ones(m, m, dtype=torch.bool))
            used = spans[-1][2] + spans[-1][3] if spans else 0
            for r in range(used, Q):  # padding queries attend to themselves only
                allow[b, r, Lmax + r] = True
        mask4d = torch.zeros((B, 1, Q, Lmax + Q), dtype=torch.float32)
        mask4d.masked_fill_(~allow.unsqueeze(1), torch.finfo(torch.float32).min)
        was_training = model.training
        model.eval()
        try:
            with autocast(self.precision, device):
                r1 = model(input_ids=ids.to(device), attention_mask=mask2d.to(device),
                           use_cache=True, logits_to_keep=keep1.to(device))
                kw = {cache_kwarg(model): cache_of(r1)}
                r2 = model(input_ids=bids.to(device), attention_mask=mask4d.to(device),
                           position_ids=bpos.to(device), use_cache=False, **kw)
        finally:
            model.train(was_training)
        lp1 = torch.log_softmax(r1.logits.float(), dim=-1).cpu()
        lp2 = torch.log_softmax(r2.logits.float(), dim=-1).cpu()
        for b, (spans, (_, positions, answers)) in enumerate(zip(blocks, rows)):
            res = [[None] * len(answers) for _ in positions]
            for k, j, st, m, p in spans:
                a = bids[b, st:st + m]
                v = torch.empty(m)
                v[0] = lp1[b, col1[p - 1], a[0]]  # first token: predicted at S[p-1]
                if m > 1:  # token t > 0: predicted at block position t-1
                    v[1:] = lp2[b, torch.arange(st, st + m - 1), a[1:]]
                res[k][j] = v.numpy()
            out[index[b]] = res


def _packed_len(row) -> int:
    seq, positions, answers = row
    return len(seq) + len(positions) * sum(len(a) for a in answers)


def naive_score(model, seq: Sequence[int], positions: Sequence[int], answer_ids: Sequence[int]
                ) -> list[np.ndarray]:
    """Reference implementation: one forward per boundary (used by tests and benchmarks)."""
    seq = list(seq)
    out = []
    with torch.no_grad():
        for p in positions:
            x = torch.tensor([seq[:p] + list(answer_ids)], dtype=torch.long)
            lp = torch.log_softmax(model(input_ids=x).logits.float(), -1)[0]
            m = len(answer_ids)
            out.append(np.array([float(lp[p - 1 + t, answer_ids[t]]) for t in range(m)]))
    return out


def reduce_scores(token_lps: Sequence[np.ndarray], how: str = "mean",
                  masks: Sequence[np.ndarray] | None = None, floor: float = -30.0) -> float:
    """Best gold answer's score: mean or sum of its token log-probs (max over answers).
    ``masks`` keep only some tokens (the gold answer's, not the template's); every
    log-prob is clamped to ``floor`` first, so a certain-wrong answer (-inf, e.g. an fp16
    overflow) gives a large finite score, never inf/NaN."""
    if how not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {how!r}")
    vals = []
    for j, a in enumerate(token_lps):
        x = np.asarray(a, dtype=np.float64)
        if masks is not None:
            x = x[masks[j]]
        x = np.clip(np.nan_to_num(x, nan=floor, neginf=floor), floor, 0.0)
        vals.append(float(x.mean() if how == "mean" else x.sum()))
    return max(vals)


def turn_scores(scorer: "GoldScorer", trajs: Sequence[Trajectory], how: str = "mean",
                gold_tokens_only: bool = True, floor: float = -30.0) -> list[np.ndarray]:
    """Per trajectory, the reduced gold-answer log-prob in the context of every turn."""
    raw = scorer.turn_start_scores(trajs)
    out = []
    for tr, per_t in zip(trajs, raw):
        golds = gold_answers(tr)
        masks = [scorer.answer_mask(g) for g in golds] if gold_tokens_only else None
        out.append(np.array([reduce_scores(lps, how, masks, floor) for lps in per_t],
                            dtype=np.float64))
    return out


def response_entropies(model, trajs: Sequence[Trajectory], pad_id: int = 0,
                       max_batch_tokens: int = 16384, precision: str | None = None,
                       temperature: float = 1.0) -> list[list[np.ndarray]]:
    """``out[i][t]``: the policy's entropy (nats) at each response token of turn t of
    trajectory i -- the entropy of the distribution that produced the token (the model's
    at the sampling ``temperature``).  Agent tokens only: observation tokens are never
    candidates for anything."""
    seqs, where, res = [], [], []
    for i, tr in enumerate(trajs):
        for sq in tr.sequences():
            seqs.append(sq.ids)
            where.append((i, sq))
            res.append(sequence_restriction(tr, sq))  # constrained turns: restricted entropy
    ents = sequence_entropies(model, seqs, pad_id, max_batch_tokens, precision, temperature,
                              res)
    out: list[list] = [[None] * tr.num_turns for tr in trajs]
    for (i, sq), e in zip(where, ents):
        for t, (a, b) in zip(sq.turns, sq.spans):
            out[i][t] = np.asarray(e[a:b], dtype=np.float64)
    return out
