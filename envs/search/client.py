"""httpx client for a Search-R1 compatible retrieval server (ours or Search-R1's).

Connection failures, timeouts and 5xx answers are retried with exponential
backoff; after the last try a :class:`RetrieverUnavailable` names the URL and
the cause.  A 4xx is the caller's mistake and is raised at once.  Passages come back
with their ``contents`` string intact (:meth:`Passage.from_contents`), so an env over
this client renders them exactly as Search-R1's generation loop renders the same
answer.  The client checks ``/health`` when created (``check=True``) so a server that
is down fails the run at start-up, not in the middle of a rollout.
"""

from __future__ import annotations

import time
from typing import Sequence

import httpx

from .data import Passage
from .retrieval import Hit


class RetrieverUnavailable(RuntimeError):
    """The retrieval server could not be reached or kept failing."""


class HTTPRetriever:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.5, check: bool = True):
        self.url = url.rstrip("/")
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self._client = httpx.Client(timeout=httpx.Timeout(timeout))
        if check:
            self.health()

    def _request(self, method: str, path: str, **kw) -> httpx.Response:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                r = self._client.request(method, self.url + path, **kw)
                if r.status_code < 500:
                    return r
                last = RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                last = exc
            if attempt < self.retries:
                time.sleep(self.backoff * 2 ** attempt)
        raise RetrieverUnavailable(
            f"retrieval server {self.url} unavailable after {self.retries + 1} tries "
            f"({type(last).__name__}: {last}); start one with "
            f"`turngym serve-retriever` or check the URL") from last

    def health(self) -> dict:
        r = self._request("GET", "/health")
        if r.status_code != 200:
            raise RetrieverUnavailable(f"{self.url}/health answered HTTP {r.status_code}")
        return r.json()

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        if not queries:
            return []
        r = self._request("POST", "/retrieve",
                          json={"queries": list(queries), "topk": int(topk),
                                "return_scores": True})
        if r.status_code != 200:
            raise ValueError(f"retrieval server rejected the request: HTTP {r.status_code} "
                             f"{r.text[:300]}")
        rows = r.json().get("result")
        if not isinstance(rows, list) or len(rows) != len(queries):
            raise RetrieverUnavailable(f"{self.url} sent a malformed answer: {r.text[:300]}")
        out = []
        try:
            for row in rows:
                hits = []
                for item in row:
                    doc = item.get("document", item)
                    contents = doc["contents"]
                    if not isinstance(contents, str):
                        raise TypeError("'contents' is not a string")
                    hits.append(Hit(Passage.from_contents(str(doc.get("id", "")), contents),
                                    float(item.get("score", 0.0))))
                out.append(hits)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RetrieverUnavailable(f"{self.url} sent a malformed answer ({exc}): "
                                       f"{r.text[:300]}") from None
        return out

    def close(self) -> None:
        self._client.close()
