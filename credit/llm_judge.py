"""An LLM judge over any OpenAI-compatible chat-completions API (httpx).

Each segment becomes one request asking for JSON ``{"role": ..., "reason": ...}``.
Output that is not such JSON, or names an unknown role, is retried (``retries``)
and then replaced by ``fallback_role`` and counted as a ``judge_error``; transport
errors, timeouts, 429 and 5xx answers are retried with backoff the same way.  A
judge that is down therefore slows credit assignment and shows up in the
metrics; it never kills a training step.

Works against ``turngym serve`` (a local transformers model, used by the tests
on loopback), vLLM's or any other OpenAI-compatible server.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import httpx

from .roles import ROLE_NAMES, Role, Segment

SYSTEM_PROMPT = (
    "You judge one step of an agent working on a task. Classify the step's role:\n"
    "- decisive_progress: the task moved measurably closer to completion.\n"
    "- useful_exploration: no direct progress, but new, relevant information or state.\n"
    "- no_progress_infrastructure: repeats, bookkeeping, invalid or no-op actions.\n"
    "- regression: the task moved further from completion (e.g. a wrong final answer).\n"
    'Reply with JSON only: {"role": "<one of the four>", "reason": "<a few words>"}'
)

_JSON = re.compile(r"\{.*?\}", re.DOTALL)


def segment_prompt(s: Segment, max_chars: int = 1500) -> str:
    def cut(x: str) -> str:
        return x if len(x) <= max_chars else x[: max_chars // 2] + " ... " + x[-max_chars // 2:]
    actions = "\n".join(f"  {a}" for a in s.actions)
    return (f"Task:\n{cut(s.task)}\n\nObservation before the step:\n{cut(s.observation_before)}"
            f"\n\nAgent action(s):\n{actions}\n\nObservation after the step:\n"
            f"{cut(s.observation_after)}\n\nRole?")


def parse_role(text: str) -> Role | None:
    """The role of the first JSON object in ``text`` that names a known one."""
    for m in _JSON.finditer(text or ""):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        obj = {str(k).strip().lower(): v for k, v in obj.items()}
        role = obj.get("role")
        if isinstance(role, str) and role.strip().lower() in ROLE_NAMES:
            return Role(role.strip().lower())
    return None


class OpenAIJudge:
    def __init__(self, base_url: str, model: str = "default", api_key: str | None = None,
                 timeout: float = 30.0, retries: int = 2, backoff: float = 0.5,
                 max_workers: int = 4, max_tokens: int = 64, temperature: float = 0.0,
                 fallback_role: str = Role.NO_PROGRESS_INFRASTRUCTURE.value):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.retries, self.backoff = model, max(0, int(retries)), float(backoff)
        self.max_workers, self.max_tokens, self.temperature = max_workers, max_tokens, temperature
        self.fallback = Role(fallback_role)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)

    def _ask(self, s: Segment) -> Role | None:
        body = {"model": self.model, "temperature": self.temperature,
                "max_tokens": self.max_tokens,
                "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                             {"role": "user", "content": segment_prompt(s)}]}
        for attempt in range(self.retries + 1):
            try:
                r = self._client.post(self.url, json=body)
                if r.status_code == 200:
                    choices = r.json().get("choices") or [{}]
                    content = (choices[0].get("message") or {}).get("content", "")
                    role = parse_role(content)
                    if role is not None:
                        return role
                elif r.status_code < 500 and r.status_code != 429:
                    return None  # the request itself is wrong: retrying will not help
            except (httpx.TransportError, httpx.TimeoutException, ValueError):
                pass
            if attempt < self.retries:
                time.sleep(self.backoff * 2 ** attempt)
        return None

    def label(self, segments: Sequence[Segment]) -> tuple[list[Role], int]:
        if not segments:
            return [], 0
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            got = list(pool.map(self._ask, segments))
        errors = sum(r is None for r in got)
        return [r if r is not None else self.fallback for r in got], errors

    def close(self) -> None:
        self._client.close()
