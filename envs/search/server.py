"""A retrieval HTTP server compatible with Search-R1's ``retrieval_server.py``.

``POST /retrieve`` with ``{"queries": [...], "topk": 3, "return_scores": true}``
answers ``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}``
(without scores: ``{"result": [[{"id", "contents"}, ...], ...]}``), so Search-R1's
own client and ours are interchangeable.  ``GET /health`` answers
``{"status": "ok", "passages": N}``.

Bad requests get a 400 with a JSON ``{"error": ...}``; the server never dies on
one.  Built on the standard library's threading HTTP server: one retriever,
requests serialised by the retriever's lock, queries of a request batched.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .retrieval import Retriever

MAX_QUERIES = 4096
MAX_TOPK = 1000
MAX_BODY = 8 << 20


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

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet by default
            pass

        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok", "passages": num_passages})
            else:
                self._send(404, {"error": f"no route GET {self.path}"})

        def do_POST(self):
            if self.path.rstrip("/") != "/retrieve":
                self._send(404, {"error": f"no route POST {self.path}"})
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                n = -1
            if not 0 < n <= MAX_BODY:
                self._send(400, {"error": "a JSON body with a valid Content-Length is required"})
                return
            try:
                body = json.loads(self.rfile.read(n))
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                self._send(200, _result(retriever, body))
            except (ValueError, json.JSONDecodeError) as exc:
                self._send(400, {"error": str(exc)})
            except Exception as exc:  # a retriever failure is the server's fault
                self._send(500, {"error": f"{type(exc).__name__}: {exc}"})

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_thread(retriever: Retriever, host: str = "127.0.0.1", port: int = 0,
                    num_passages: int | None = None) -> tuple[ThreadingHTTPServer, str]:
    """Starts a server on a daemon thread; returns it and its base URL."""
    server = make_server(retriever, host, port, num_passages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    h, p = server.server_address[:2]
    return server, f"http://{h}:{p}"
