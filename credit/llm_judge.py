"""An LLM judge over any OpenAI-compatible chat-completions API (httpx).

Each segment becomes one request: a system prompt defining the four roles
(:data:`SYSTEM_PROMPT`, or ``system_prompt``) and a user message rendered from a
template (:data:`USER_TEMPLATE`, or ``user_template``) with the fields ``{task}``,
``{observation_before}``, ``{actions}`` and ``{observation_after}``.  The reply must
contain a JSON object ``{"role": ..., "reason": ...}`` naming one of the four roles.
Output that is not such JSON, or names an unknown role, is retried (``retries``;
after an unparseable reply the retry samples at ``retry_temperature`` with a
per-attempt seed, since greedy decoding would only repeat it) and then replaced by
``fallback_role`` and counted as a ``judge_error``; transport errors, timeouts, 429
and 5xx answers are retried with backoff the same way.  A
judge that is down therefore slows credit assignment and shows up in the
metrics; it never kills a training step.  :meth:`OpenAIJudge.verdicts` returns the
per-segment record (attempts, parse / HTTP / transport failures, latency, the raw
reply) that ``turngym judge-eval`` reports.

Works against ``turngym serve`` (a local transformers model, used by the tests
on loopback), vLLM's or any other OpenAI-compatible server.
"""

from __future__ import annotations

import json
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import httpx

from .roles import ROLE_NAMES, Role, Segment

SYSTEM_PROMPT = (
    "You judge one step of an agent working on a task. Read the task, the observation "
    "before the step, the agent's action(s) and the observation after, then classify the "
    "step into exactly one role:\n"
    "- decisive_progress: the task moved measurably closer to completion (a required "
    "subgoal was reached, information needed for the answer was found, or the task was "
    "solved).\n"
    "- useful_exploration: no direct progress, but the agent reached a new state or got "
    "new, relevant information.\n"
    "- no_progress_infrastructure: nothing new: a repeated action, bookkeeping, an invalid "
    "or malformed action, or an action that changed nothing.\n"
    "- regression: the task moved further from completion (an achieved subgoal was undone, "
    "or a wrong final answer was given).\n"
    "Reply with one JSON object and nothing else: "
    '{"role": "<decisive_progress|useful_exploration|no_progress_infrastructure|regression>", '
    '"reason": "<a few words>"}'
)

USER_TEMPLATE = (
    "Task:\n{task}\n\nObservation before the step:\n{observation_before}\n\n"
    "Agent action(s):\n{actions}\n\nObservation after the step:\n{observation_after}"
    "\n\nWhich role does this step have? Answer with JSON only: "
    '{{"role": "<role>", "reason": "<a few words>"}}'
)

TEMPLATE_FIELDS = ("task", "observation_before", "actions", "observation_after")


def check_template(template: str) -> None:
    """Refuses a user template with fields other than :data:`TEMPLATE_FIELDS` (no
    attribute or index access), unbalanced braces, or none of the fields."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"judge user_template: {exc} (write a literal brace as {{{{ or }}}})") \
            from None
    names = [f for _, f, _, _ in parsed if f is not None]
    bad = sorted({f for f in names if f not in TEMPLATE_FIELDS})
    if bad:
        raise ValueError(f"judge user_template: unknown field(s) {bad}; "
                         f"fields are {list(TEMPLATE_FIELDS)}")
    if any(spec or conv for _, f, spec, conv in parsed if f is not None):
        raise ValueError("judge user_template: fields take no format spec or conversion")
    if not names:
        raise ValueError(f"judge user_template names none of {list(TEMPLATE_FIELDS)}")


def segment_prompt(s: Segment, max_chars: int = 1500, template: str = USER_TEMPLATE) -> str:
    """The user message for segment ``s``: ``template`` with every text field cut to
    ``max_chars`` (its head and tail kept)."""
    def cut(x: str) -> str:
        return x if len(x) <= max_chars else x[: max_chars // 2] + " ... " + x[-max_chars // 2:]
    actions = "\n".join(f"  {cut(a)}" for a in s.actions)
    return template.format(task=cut(s.task), observation_before=cut(s.observation_before),
                           actions=actions, observation_after=cut(s.observation_after))


def _role_name(x: object) -> Role | None:
    if not isinstance(x, str):
        return None
    name = "_".join(x.strip().lower().replace("-", " ").split())
    return Role(name) if name in ROLE_NAMES else None


def parse_role(text: str | None) -> Role | None:
    """The role of the first JSON object in ``text`` whose ``role`` names a known one
    (keys and role names case- and spacing-insensitive: ``"Useful exploration"`` is
    ``useful_exploration``); anything else, e.g. a bare role name without JSON, is None."""
    text = text or ""
    dec = json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        try:
            obj, _ = dec.raw_decode(text, i)
        except ValueError:  # JSONDecodeError, or a number too large to convert
            obj = None
        if isinstance(obj, dict):
            role = _role_name({str(k).strip().lower(): v for k, v in obj.items()}.get("role"))
            if role is not None:
                return role
        i = text.find("{", i + 1)
    return None


@dataclass(frozen=True)
class Verdict:
    """One segment's judge call: ``role`` is None when every attempt failed (the caller
    then uses the fallback role)."""

    role: Role | None
    attempts: int
    parse_failures: int  # 200 answers without a valid JSON role
    http_failures: int  # non-200 answers (retried when 429 or 5xx)
    transport_failures: int  # connection errors, timeouts, unreadable bodies
    latency_s: float  # wall time of the whole call, retries and backoff included
    reply: str  # the last reply's content (clipped to 500 characters)


def _content(r: httpx.Response) -> str:
    """The first choice's message content of a chat-completion body; ValueError when the
    body is not one."""
    body = r.json()
    try:
        msg = body["choices"][0]["message"]
        content = msg.get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("not a chat completion") from None
    if content is not None and not isinstance(content, str):
        raise ValueError("message content is not a string")
    return content or ""


class OpenAIJudge:
    def __init__(self, base_url: str, model: str = "default", api_key: str | None = None,
                 timeout: float = 30.0, retries: int = 2, backoff: float = 0.5,
                 max_workers: int = 4, max_tokens: int = 64, temperature: float = 0.0,
                 fallback_role: str = Role.NO_PROGRESS_INFRASTRUCTURE.value,
                 system_prompt: str | None = None, user_template: str | None = None,
                 max_chars: int = 1500, retry_temperature: float = 0.7):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.retries, self.backoff = model, max(0, int(retries)), float(backoff)
        self.max_workers, self.max_tokens, self.temperature = max_workers, max_tokens, temperature
        self.fallback = Role(fallback_role)
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.user_template = USER_TEMPLATE if user_template is None else user_template
        check_template(self.user_template)
        self.max_chars = int(max_chars)
        self.retry_temperature = float(retry_temperature)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)
        self._lock = threading.Lock()
        self.calls = self.errors = 0  # segments judged / fallen back, over this judge's life

    def request_body(self, s: Segment) -> dict:
        return {"model": self.model, "temperature": self.temperature,
                "max_tokens": self.max_tokens,
                "messages": [{"role": "system", "content": self.system_prompt},
                             {"role": "user", "content": segment_prompt(
                                 s, self.max_chars, self.user_template)}]}

    def verdict(self, s: Segment) -> Verdict:
        body = self.request_body(s)
        parse = http = transport = 0
        reply = ""
        t0 = time.perf_counter()
        for attempt in range(self.retries + 1):
            if parse:  # greedy decoding would repeat the unparseable reply: sample instead
                body = dict(body, temperature=max(self.temperature, self.retry_temperature),
                            seed=attempt)
            try:
                r = self._client.post(self.url, json=body)
                if r.status_code == 200:
                    reply = _content(r)
                    role = parse_role(reply)
                    if role is not None:
                        return Verdict(role, attempt + 1, parse, http, transport,
                                       time.perf_counter() - t0, reply[:500])
                    parse += 1
                else:
                    http += 1
                    reply = r.text[:500]
                    if r.status_code < 500 and r.status_code != 429:
                        break  # the request itself is wrong: retrying will not help
            except (httpx.TransportError, httpx.TimeoutException, ValueError):
                transport += 1  # no answer, or a 200 whose body is not a chat completion
            if attempt < self.retries:
                time.sleep(self.backoff * 2 ** attempt)
        return Verdict(None, parse + http + transport, parse, http, transport,
                       time.perf_counter() - t0, reply[:500])

    def verdicts(self, segments: Sequence[Segment], max_workers: int | None = None
                 ) -> list[Verdict]:
        """One :class:`Verdict` per segment, in order (``max_workers`` concurrent calls)."""
        if not segments:
            return []
        with ThreadPoolExecutor(max_workers=max_workers or self.max_workers) as pool:
            got = list(pool.map(self.verdict, segments))
        with self._lock:
            self.calls += len(got)
            self.errors += sum(v.role is None for v in got)
        return got

    def label(self, segments: Sequence[Segment]) -> tuple[list[Role], int]:
        got = self.verdicts(segments)
        errors = sum(v.role is None for v in got)
        return [v.role if v.role is not None else self.fallback for v in got], errors

    def close(self) -> None:
        self._client.close()
