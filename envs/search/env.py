"""``turngym/SearchQA-v0``: multi-turn search QA in Search-R1's format.

``reset(seed=i)`` poses question ``i`` of the split (modulo its size).  Each step
takes the agent's whole response text: a ``<search>`` returns the top-k passages
in an ``<information>`` block, an ``<answer>`` ends the episode with reward
exact-match (or F1 with ``reward="f1"``), anything else gets Search-R1's
invalid-action message.  After ``max_turns`` actions without an answer the
episode is truncated with reward 0.

Privileged info for credit modules (never in the observation): ``gold_answer``,
``gold_passages``, ``progress`` (gold passages retrieved so far), ``state_key``.

Batched retrieval: :meth:`SearchQAEnv.prepare_steps` takes the envs and actions
of one rollout turn and runs every search query through the shared retriever in
one batch; ``step`` then uses the prefetched result.  Calling ``step`` alone
works the same, one query at a time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..base import TextEnv, sanitize
from .data import QAExample
from .dataset import get_dataset, get_retriever
from .protocol import (INVALID_ACTION_MESSAGE, SEARCH_R1_INSTRUCTION, SearchAction,
                       exact_match, f1_score, format_passages, information_block,
                       parse_search_action)

PROMPT_STYLES = {
    "searchr1": SEARCH_R1_INSTRUCTION,
    "plain": "Question: {question}",
}


@dataclass(frozen=True)
class _State:
    index: int
    turns: int = 0
    done: bool = False
    queries: tuple[str, ...] = ()
    seen: tuple[str, ...] = ()  # retrieved passage ids, in order, no repeats
    observations: tuple[str, ...] = field(default=(), repr=False)


class SearchQAEnv(TextEnv):
    max_observation_length = 16384

    def __init__(self, split: str = "train", dataset: dict | None = None,
                 retriever: dict | None = None, topk: int = 3, max_turns: int = 4,
                 reward: str = "em", prompt_style: str = "searchr1",
                 render_mode: str | None = None):
        super().__init__(render_mode)
        if reward not in ("em", "f1"):
            raise ValueError(f"reward must be 'em' or 'f1', got {reward!r}")
        if prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {sorted(PROMPT_STYLES)}")
        if topk < 1 or max_turns < 1:
            raise ValueError("topk and max_turns must be >= 1")
        self.dataset_spec = dict(dataset or {})
        self.retriever_spec = dict(retriever or {"kind": "dense"})
        self.dataset = get_dataset(self.dataset_spec)
        self.questions = self.dataset.questions(split)
        if not self.questions:
            raise ValueError(f"split {split!r} has no questions")
        self.retriever = get_retriever(self.dataset_spec, self.retriever_spec)
        self.split, self.topk, self.max_turns = split, topk, max_turns
        self.reward_kind, self.prompt_style = reward, prompt_style
        self.state: _State | None = None
        self._prefetched: tuple[str, list] | None = None

    # ---------------------------------------------------------------- gym API
    @property
    def example(self) -> QAExample:
        if self.state is None:
            raise RuntimeError("call reset() first")
        return self.questions[self.state.index]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        index = options.get("task_index", seed)
        if index is None:
            index = int(self.np_random.integers(0, len(self.questions)))
        self.state = _State(int(index) % len(self.questions))
        self._prefetched = None
        obs = PROMPT_STYLES[self.prompt_style].format(question=self.example.question)
        obs = sanitize(obs, self.max_observation_length)
        self._last_obs = obs
        return obs, self._info(SearchAction("reset"), obs)

    def step(self, action: str):
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        if self.state.done:
            raise RuntimeError("episode is over; call reset()")
        act = parse_search_action(action if isinstance(action, str) else str(action),
                                  self.max_action_length)
        st = replace(self.state, turns=self.state.turns + 1)
        reward, terminated, extra = 0.0, False, {}
        if act.kind == "search":
            hits = self._search(act.content)
            ids = [h.passage.id for h in hits]
            obs = information_block([h.passage for h in hits])
            st = replace(st, queries=st.queries + (act.content,),
                         seen=st.seen + tuple(i for i in dict.fromkeys(ids) if i not in st.seen))
            extra["retrieved_ids"] = ids
        elif act.kind == "answer":
            golds = self.example.golden_answers
            em, f1 = exact_match(act.content, golds), f1_score(act.content, golds)
            reward = em if self.reward_kind == "em" else f1
            terminated = True
            obs = ""
            extra.update(em=em, f1=f1, prediction=act.content, answered=True)
        else:
            obs = INVALID_ACTION_MESSAGE
            extra["format_error"] = act.error
        truncated = not terminated and st.turns >= self.max_turns
        self.state = replace(st, done=terminated or truncated,
                             observations=st.observations + (obs,))
        obs = sanitize(obs, self.max_observation_length)
        self._last_obs = obs
        info = self._info(act, obs)
        info.update(extra)
        info["won"] = bool(terminated and extra.get("em", 0.0) == 1.0)
        return obs, float(reward), terminated, truncated, info

    def _info(self, act: SearchAction, obs: str) -> dict[str, Any]:
        st, ex = self.state, self.example
        assert st is not None
        gold = set(ex.gold_passages)
        return {
            "task_id": f"{self.split}/{ex.qid}",
            "task_type": f"{ex.hops}-hop" if ex.hops else "qa",
            "hops": ex.hops,
            "gold_answer": list(ex.golden_answers),
            "gold_passages": list(ex.gold_passages),
            "progress": [p for p in st.seen if p in gold],
            "action_kind": act.kind,
            "valid_action": act.kind in ("search", "answer", "reset"),
            "valid_format": act.kind != "invalid",
            "state_key": hashlib.sha1(f"{ex.qid}\x00{obs}".encode()).hexdigest()[:16],
            "steps": st.turns,
            "won": False,
        }

    # ---------------------------------------------------------------- retrieval
    def _search(self, query: str) -> list:
        pre, self._prefetched = self._prefetched, None
        if pre is not None and pre[0] == query:
            return pre[1]
        return self.retriever.search([query], self.topk)[0]

    @classmethod
    def prepare_steps(cls, envs: Sequence["SearchQAEnv"], actions: Sequence[str]) -> None:
        """Runs the search queries of one turn of many envs in one batch per retriever."""
        batches: dict[int, list[tuple[SearchQAEnv, str]]] = {}
        for env, action in zip(envs, actions):
            env._prefetched = None
            if env.state is None or env.state.done:
                continue
            act = parse_search_action(action, env.max_action_length)
            if act.kind == "search":
                batches.setdefault(id(env.retriever), []).append((env, act.content))
        for items in batches.values():
            by_k: dict[int, list[tuple[SearchQAEnv, str]]] = {}
            for env, q in items:
                by_k.setdefault(env.topk, []).append((env, q))
            for k, group in by_k.items():
                results = group[0][0].retriever.search([q for _, q in group], k)
                for (env, q), hits in zip(group, results):
                    env._prefetched = (q, hits)

    # ---------------------------------------------------------------- replay
    def snapshot(self) -> _State:
        if self.state is None:
            raise RuntimeError("call reset() first")
        return self.state

    def restore(self, snap: _State) -> None:
        self.state = snap  # frozen: sharing is safe
        self._prefetched = None
        self._last_obs = snap.observations[-1] if snap.observations else self._last_obs

    # ---------------------------------------------------------------- expert
    def oracle_action(self, rng=None, epsilon: float = 0.0) -> str:
        """An honest multi-hop searcher for generated questions.

        It issues hop k's query only once hop k-1's gold passage (the one stating
        the fact) has been retrieved, reformulates once (the bare entity name) if
        a search missed, and answers only what it has read; it gives up with
        ``<answer> unknown </answer>`` when retrieval fails it twice.
        """
        ex = self.example
        st = self.state
        assert st is not None
        if not ex.oracle_queries:
            raise NotImplementedError("this dataset has no hop annotations, so no oracle")
        k = 0
        while k < ex.hops and ex.gold_passages[k] in st.seen:
            k += 1
        if k == ex.hops:
            return f"<answer> {ex.hop_answers[-1]} </answer>"
        primary = ex.oracle_queries[k]
        entity = ex.hop_answers[k - 1] if k > 0 else primary
        for q in (primary, entity):
            if q not in st.queries:
                return f"<search> {q} </search>"
        return "<answer> unknown </answer>"

    def lm_corpus(self) -> list[str]:
        """Passages rendered as the agent sees them (warm-start language modelling)."""
        return [format_passages([p]).strip() for p in self.dataset.passages]

    def entity_phrases(self) -> list[str]:
        """Multi-word entity names (passage titles); tiny tokenizers may fuse each into
        one token, as the text world's "cabinet 1"."""
        return sorted({p.title for p in self.dataset.passages if " " in p.title})

    def vocabulary(self) -> list[str]:
        """Words of the corpus and questions (tiny word-level tokenizers)."""
        words: set[str] = set()
        for p in self.dataset.passages:
            words.update(p.title.lower().split())
            words.update(p.text.lower().replace(",", " ").replace(".", " ")
                         .replace("(", " ").replace(")", " ").split())
        for split in self.dataset.splits.values():
            for q in split:
                words.update(q.question.lower().rstrip("?").split())
        return sorted(words)
