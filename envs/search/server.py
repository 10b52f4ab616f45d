"""A retrieval HTTP server that Search-R1's and SkyRL-gym's own clients accept.

``POST /retrieve`` takes either request form:

* Search-R1 (``search_r1/search/retrieval_server.py``, client in
  ``search_r1/llm_agent/generation.py``): ``{"queries": [...], "topk": 3,
  "return_scores": true}``;
* SkyRL-gym (``skyrl_gym/tools/search.py``, server in
  ``examples/train/search/retriever/retrieval_server.py``): ``{"query": "...", "topk": 3,
  "return_scores": true}``;

and answers both as those servers do: ``{"result": [row, ...]}``, one row per query (one
row for ``query``), each row ``[{"document": {"id", "contents"}, "score": s}, ...]``, or
``[{"id", "contents"}, ...]`` without scores.  ``contents`` is FlashRAG's ``"Title"\\ntext``
form, which both clients render (see :mod:`.protocol`).  ``topk`` missing or null means the
server's default (3, as theirs); ``return_scores`` defaults to false, as theirs.
``GET /health`` answers ``{"status": "ok", "passages": N}``.

Refused with a JSON ``{"error": ...}``: a malformed or oversized request (400: unknown
keys, both or neither of ``query``/``queries``, more than ``max_queries`` queries, ``topk``
outside ``[1, max_topk]``, more than ``max_results`` queries x topk, wrong types; 413: a
body over the byte cap; 408: a body that does not arrive in time).  A retriever failure answers 500 and the server keeps serving.

Fairness: one retriever serves every connection, so a request's queries are searched in
chunks of ``chunk_queries``, each chunk one hold of a first-come first-served lock on a
worker thread.  A 4,096-query batch therefore delays a one-query request by one chunk,
not by the whole batch, and the event loop keeps accepting meanwhile.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse

from ...jsonhttp import (HTTPError, Limits, Server, disconnected, fifo_lock_hold, is_unicode,
                         json_response, make_app, read_json, run_sync)
from .retrieval import Hit, Retriever

REQUEST_KEYS = {"queries", "query", "topk", "return_scores"}


@dataclass(frozen=True)
class RetrieverLimits:
    max_queries: int = 4096       # Search-R1 sends one query per live rollout (e.g. 512 x 5)
    max_topk: int = 100
    max_results: int = 65536      # queries x topk: bounds the answer's size
    default_topk: int = 3
    chunk_queries: int = 64       # queries per lock hold
    http: Limits = Limits(max_body_bytes=4 << 20)

    def __post_init__(self) -> None:
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError("default_topk must be in [1, max_topk]")
        if self.max_queries < 1 or self.chunk_queries < 1:
            raise ValueError("max_queries and chunk_queries must be >= 1")


def parse_request(body: dict[str, Any], limits: RetrieverLimits) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a ``/retrieve`` body; HTTPError 400 otherwise."""
    unknown = sorted(set(body) - REQUEST_KEYS)
    if unknown:
        raise HTTPError(400, f"unknown request field(s) {unknown}; this server reads "
                             f"{sorted(REQUEST_KEYS)}", param=unknown[0])
    if ("query" in body) == ("queries" in body):
        raise HTTPError(400, "give exactly one of 'queries' (a list of strings, Search-R1) "
                             "or 'query' (one string, SkyRL-gym)", param="queries")
    if "query" in body:
        if not isinstance(body["query"], str):
            raise HTTPError(400, "'query' must be a string", param="query")
        queries = [body["query"]]
    else:
        queries = body["queries"]
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise HTTPError(400, "'queries' must be a list of strings", param="queries")
        if len(queries) > limits.max_queries:
            raise HTTPError(400, f"{len(queries)} queries in one request; at most "
                                 f"{limits.max_queries}", param="queries")
    if not all(map(is_unicode, queries)):
        field = "query" if "query" in body else "queries"
        raise HTTPError(400, f"'{field}' holds text that is not valid Unicode (a lone "
                             "surrogate escape)", param=field)
    topk = body.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= limits.max_topk:
        raise HTTPError(400, f"'topk' must be an integer in [1, {limits.max_topk}]",
                        param="topk")
    if len(queries) * topk > limits.max_results:
        raise HTTPError(400, f"{len(queries)} queries x topk {topk} = {len(queries) * topk} "
                             f"results; at most {limits.max_results} per request", param="topk")
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise HTTPError(400, "'return_scores' must be true or false", param="return_scores")
    return queries, topk, scores


def result_rows(hits: Sequence[Sequence[Hit]], return_scores: bool) -> list[list[dict]]:
    """Search-R1's answer rows: documents are corpus rows ``{"id", "contents"}``."""
    if return_scores:
        return [[{"document": {"id": h.passage.id, "contents": h.passage.contents},
                  "score": h.score} for h in row] for row in hits]
    return [[{"id": h.passage.id, "contents": h.passage.contents} for h in row] for row in hits]


def make_app_for(retriever: Retriever, limits: RetrieverLimits = RetrieverLimits(),
                 num_passages: int | None = None):
    lock = asyncio.Lock()  # created outside a loop: binds to the server's loop on first use

    async def health(request: Request) -> JSONResponse:
        return json_response(200, {"status": "ok", "passages": num_passages})

    async def retrieve(request: Request) -> JSONResponse:
        body = await read_json(request, limits.http)
        queries, topk, scores = parse_request(body, limits)
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), limits.chunk_queries):
            if start and await disconnected(request):
                return json_response(499, {"error": "client closed the request"})
            chunk = queries[start:start + limits.chunk_queries]
            rows = await fifo_lock_hold(lock, retriever.search, chunk, topk)
            if len(rows) != len(chunk):
                raise RuntimeError(f"the retriever answered {len(rows)} rows for "
                                   f"{len(chunk)} queries")
            hits.extend(rows)
        # a large answer is serialised off the event loop too
        return await run_sync(lambda: json_response(200, {"result": result_rows(hits, scores)}))

    return make_app([("GET", "/health", health), ("POST", "/retrieve", retrieve)])


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000,
                num_passages: int | None = None,
                limits: RetrieverLimits = RetrieverLimits()) -> Server:
    """A server bound to ``(host, port)`` (port 0: any free port); ``start()`` runs it on a
    thread, ``serve_forever()`` in this one, ``stop()`` ends it."""
    return Server(make_app_for(retriever, limits, num_passages), host, port, limits.http)


def serve_in_thread(retriever: Retriever, host: str = "127.0.0.1", port: int = 0,
                    num_passages: int | None = None,
                    limits: RetrieverLimits = RetrieverLimits()) -> tuple[Server, str]:
    """Starts a server on a daemon thread; returns it and its base URL."""
    server = make_server(retriever, host, port, num_passages, limits)
    return server, server.start()
