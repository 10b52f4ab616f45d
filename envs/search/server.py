"""A retrieval HTTP server compatible with Search-R1's ``retrieval_server.py``.

``POST /retrieve`` with ``{"queries": [...], "topk": 3, "return_scores": true}``
answers ``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}``
(without scores: ``{"result": [[{"id", "contents"}, ...], ...]}``), so Search-R1's
own client and ours are interchangeable.  ``GET /health`` answers
``{"status": "ok", "passages": N}``.

Bad requests get a 400 with a JSON ``{"error": ...}``; the server never dies on
one.  Built on :mod:`turngym.jsonhttp` (standard library): one retriever,
requests serialised by the retriever's lock, queries of a request batched.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer
from typing import Any

from ...jsonhttp import json_server, start_in_thread
from .retrieval import Retriever

MAX_QUERIES = 4096
MAX_TOPK = 1000


def _result(retriever: Retriever, body: dict[str, Any]) -> dict:
    queries = body.get("queries")
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("'queries' must be a list of strings")
    if len(queries) > MAX_QUERIES:
        raise ValueError(f"at most {MAX_QUERIES} queries per request")
    topk = body.get("topk", 3)
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"'topk' must be an integer in [1, {MAX_TOPK}]")
    scores = bool(body.get("return_scores", False))
    hits = retriever.search(queries, topk)
    if scores:
        res = [[{"document": {"id": h.passage.id, "contents": h.passage.contents},
                 "score": h.score} for h in row] for row in hits]
    else:
        res = [[{"id": h.passage.id, "contents": h.passage.contents} for h in row]
               for row in hits]
    return {"result": res}


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000,
                num_passages: int | None = None) -> ThreadingHTTPServer:
    """A server bound to ``(host, port)`` (port 0: any free port); call ``serve_forever``."""
    return json_server(
        get={"/health": lambda: {"status": "ok", "passages": num_passages}},
        post={"/retrieve": lambda body: _result(retriever, body)},
        error=lambda code, msg: {"error": msg}, host=host, port=port)


def serve_in_thread(retriever: Retriever, host: str = "127.0.0.1", port: int = 0,
                    num_passages: int | None = None) -> tuple[ThreadingHTTPServer, str]:
    """Starts a server on a daemon thread; returns it and its base URL."""
    server = make_server(retriever, host, port, num_passages)
    return server, start_in_thread(server)
