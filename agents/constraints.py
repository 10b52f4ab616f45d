"""Constrained action decoding: the response must be one of the env's admissible commands.

With ``agent.constrain_actions: admissible`` every turn's response is sampled token by
token from the policy's distribution restricted to the continuations that spell one of
``info["admissible_commands"]`` in ``agent.action_format`` followed by the stop token
(a prefix trie over token ids).  The env stays text-only; the agent turns its command
list into token sequences once per distinct command.

The sampled distribution is the *restricted* one, so everything that scores a response
(the PPO ratio, recomputed old log-probs, the KL reference, entropies) must restrict the
same way: each :class:`~turngym.types.Turn` carries the allowed sequences
(``Turn.choices``) and :func:`allowed_per_position` rebuilds, for each response token,
the set it was drawn from.  ``logp_restricted(t) = logp(t) - logsumexp(logp[allowed])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

ADMISSIBLE_KEY = "admissible_commands"


@dataclass(frozen=True)
class ActionChoices:
    """The responses allowed at one turn: token sequences (each ends with a stop token)
    and the env action each one spells."""

    sequences: tuple[tuple[int, ...], ...]
    actions: tuple[str, ...]
    _trie: dict = field(init=False, repr=False, compare=False)
    _by_ids: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.sequences) != len(self.actions):
            raise ValueError("one action per allowed sequence")
        if not self.sequences:
            raise ValueError("no allowed response")
        if not all(self.sequences):
            raise ValueError("an allowed response needs at least one token")
        by_ids: dict = {}
        for seq, act in zip(self.sequences, self.actions):
            by_ids.setdefault(tuple(seq), act)  # two commands with equal tokens: the first
        object.__setattr__(self, "_trie", _trie(self.sequences))
        object.__setattr__(self, "_by_ids", by_ids)

    def allowed_next(self, prefix: Sequence[int]) -> list[int]:
        """Token ids that may follow ``prefix`` (empty when ``prefix`` left the trie or
        completed a sequence)."""
        node = self._trie
        for t in prefix:
            node = node.get(int(t))
            if node is None:
                return []
        return list(node)

    def engine_next(self, prefix: Sequence[int]) -> list[int]:
        """What an engine's logits mask keeps after ``prefix``: :meth:`allowed_next`, or,
        once ``prefix`` completed a sequence, its last (stop) token -- an engine that runs
        a finished request one more step (vLLM's async scheduling) discards that sample.
        A prefix that left the trie is a bug upstream: RuntimeError."""
        allowed = self.allowed_next(prefix)
        if allowed:
            return allowed
        if self.action_of(prefix) is None:
            raise RuntimeError(f"constrained response ran past its choices after {len(prefix)} "
                               "tokens (the stop token should have ended it)")
        return [int(prefix[-1])]

    def after(self, prefix: Sequence[int]) -> ActionChoices:
        """The choices left once ``prefix`` is sampled (their remaining tokens): what a
        response resumed mid-way (a branch inside a turn) may still continue with."""
        if not prefix:
            return self
        n, pre = len(prefix), tuple(int(t) for t in prefix)
        kept = [(s[n:], a) for s, a in zip(self.sequences, self.actions)
                if len(s) > n and tuple(s[:n]) == pre]
        if not kept:
            raise ValueError("the response prefix is not the start of any allowed response")
        return ActionChoices(tuple(s for s, _ in kept), tuple(a for _, a in kept))

    def action_of(self, ids: Sequence[int]) -> str | None:
        """The action ``ids`` spells, or ``None`` when it is not one of the sequences."""
        return self._by_ids.get(tuple(int(t) for t in ids))


def _trie(sequences: Sequence[Sequence[int]]) -> dict:
    """Nested dicts token id -> subtree: the prefix trie of ``sequences``."""
    trie: dict = {}
    for seq in sequences:
        node = trie
        for t in seq:
            node = node.setdefault(int(t), {})
    return trie


def allowed_per_position(sequences: Sequence[Sequence[int]], response: Sequence[int]
                         ) -> list[list[int]]:
    """For each token of ``response``, the ids it was drawn from under the trie of
    ``sequences``.  Raises when the response is not a path of that trie (the sampler
    would never have produced it)."""
    out = []
    node = _trie(sequences)
    for k, t in enumerate(response):
        allowed = list(node)
        if int(t) not in node:
            raise ValueError(f"response token {k} ({int(t)}) is not an allowed continuation")
        out.append(allowed)
        node = node[int(t)]
    return out


Restriction = tuple[tuple[int, tuple[int, ...]], ...]
"""(position in a token sequence, the ids the token there was drawn from), for every
constrained response token of that sequence."""


def sequence_restriction(traj, seq) -> Restriction:
    """The :data:`Restriction` of one of ``traj.sequences()``: empty when none of its
    turns was constrained (the usual case, at no cost)."""
    out: list[tuple[int, tuple[int, ...]]] = []
    for k, (a, _b) in zip(seq.turns, seq.spans):
        turn = traj.turns[k]
        if turn.choices:
            for j, allowed in enumerate(allowed_per_position(turn.choices, turn.response_ids)):
                out.append((a + j, tuple(allowed)))
    return tuple(out)


class ActionConstraint:
    """Builds each turn's :class:`ActionChoices` from the env's admissible commands.

    ``tokenizer`` encodes ``action_format.format(action=cmd)`` (as the warm-start demos
    do) and ``stop_id`` ends each sequence.  Commands longer than ``max_new_tokens`` are
    dropped (the sampler could not finish them); an info without any usable command is
    an error, not a silent unconstrained turn."""

    def __init__(self, tokenizer, action_format: str, stop_id: int, max_new_tokens: int):
        self.tok = tokenizer
        self.action_format = action_format
        self.stop_id = int(stop_id)
        self.max_new_tokens = int(max_new_tokens)
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, command: str) -> tuple[int, ...]:
        ids = self._cache.get(command)
        if ids is None:
            text = self.action_format.format(action=command)
            ids = tuple(self.tok(text, add_special_tokens=False)["input_ids"]) + (self.stop_id,)
            self._cache[command] = ids
        return ids

    def choices(self, commands: Sequence[str]) -> ActionChoices:
        """The choices of one turn whose env listed ``commands`` (its info's
        :data:`ADMISSIBLE_KEY`)."""
        if not commands:
            raise ValueError(f"agent.constrain_actions needs the env to list {ADMISSIBLE_KEY!r} in "
                             "its info at every step (the text world and ALFWorld do); set "
                             "agent.constrain_actions=false for free generation")
        seqs, acts = [], []
        for c in commands:
            ids = self.encode(str(c))
            if len(ids) <= self.max_new_tokens:
                seqs.append(ids)
                acts.append(str(c))
        if not seqs:
            raise ValueError(f"no admissible command fits agent.max_new_tokens="
                             f"{self.max_new_tokens} once formatted; raise it")
        return ActionChoices(tuple(seqs), tuple(acts))
