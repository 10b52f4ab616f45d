"""Search-R1's text protocol and answer scoring, kept byte-compatible with it.

* The agent writes ``<search> query </search>`` or ``<answer> text </answer>``;
  the first complete tag of either kind counts (Search-R1's
  ``postprocess_predictions``).
* A search returns
  ``\\n\\n<information>Doc 1(Title: "t") text\\nDoc 2(...)...</information>\\n\\n``:
  passages go over the wire as FlashRAG ``contents`` (``"Title"\\ntext``) and Search-R1
  keeps the title line whole, quotes included.
* Anything else gets Search-R1's invalid-action message.
* Scoring: SQuAD normalisation (lower case, no punctuation, no articles, single
  spaces), exact match against any gold answer, token F1 (max over gold answers).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from .data import Passage

INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)

SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)

_TAGS = ("search", "answer")


@dataclass(frozen=True)
class SearchAction:
    kind: str  # "search" | "answer" | "invalid"
    content: str = ""
    error: str | None = None


def parse_search_action(text: str, max_chars: int = 1000) -> SearchAction:
    if not isinstance(text, str):
        return SearchAction("invalid", error="output is not text")
    m = _first_tag(text)
    if m is None:
        if "<search>" in text or "<answer>" in text:
            return SearchAction("invalid", error="unterminated <search>/<answer> tag")
        return SearchAction("invalid", error="no <search> or <answer> tag")
    kind, body = m
    # a lone surrogate (a sampled or JSON-escaped "\\ud800") is no text a tokenizer takes
    content = " ".join(body.encode("utf-8", "replace").decode("utf-8").split())
    if not content:
        return SearchAction("invalid", error=f"empty <{kind}>")
    if len(content) > max_chars:
        return SearchAction("invalid", error=f"<{kind}> longer than {max_chars} chars")
    return SearchAction(kind, content)


def _first_tag(text: str) -> tuple[str, str] | None:
    """The first ``<search>...</search>`` or ``<answer>...</answer>`` (what
    ``re.search(r"<(search|answer)>(.*?)</\\1>", text, re.DOTALL)`` finds) in linear
    time: the response is untrusted, and that regex is quadratic on unclosed tags.  An
    opening with no closing tag of its kind after it means no later opening of that kind
    has one either, so each kind is dropped after its first failure."""
    nxt = {t: text.find(f"<{t}>") for t in _TAGS}
    last_close = {t: text.rfind(f"</{t}>") for t in _TAGS}
    while True:
        live = [t for t in _TAGS if nxt[t] >= 0]
        if not live:
            return None
        tag = min(live, key=lambda t: nxt[t])
        start = nxt[tag] + len(tag) + 2
        if last_close[tag] >= start:
            return tag, text[start:text.find(f"</{tag}>", start)]
        nxt[tag] = -1


def format_contents(contents: Sequence[str]) -> str:
    """Search-R1's ``_passages2string`` (``search_r1/llm_agent/generation.py``) over the
    ``contents`` strings of one result row: the first line is the title line, kept as it
    is (quotes included), the rest is the text, unstripped."""
    out = []
    for i, c in enumerate(contents):
        title, _, text = c.partition("\n")
        out.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(out)


def format_passages(passages: Sequence[Passage]) -> str:
    """Search-R1's rendering of these passages as a retrieval server sends them."""
    return format_contents([p.contents for p in passages])


def information_block(passages: Sequence[Passage]) -> str:
    """The observation after a search: Search-R1's ``execute_predictions`` wraps the
    stripped rendering in ``\\n\\n<information>...</information>\\n\\n``."""
    return f"\n\n<information>{format_passages(passages).strip()}</information>\n\n"


# ------------------------------------------------------------------ scoring
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    pred = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        gold = normalize_answer(g).split()
        common = Counter(pred) & Counter(gold)
        same = sum(common.values())
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        if same == 0:
            continue
        p, r = same / len(pred), same / len(gold)
        best = max(best, 2 * p * r / (p + r))
    return best


def contains_answer(text: str, golds: Sequence[str]) -> bool:
    """Whether a normalised gold answer occurs as a word sequence in ``text``."""
    t = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(g)} " in t for g in golds if normalize_answer(g))
