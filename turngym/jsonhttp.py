"""A tiny JSON-over-HTTP server base (standard library) shared by turngym's servers.

Subclasses map routes to functions; this handles body limits, JSON parsing, status
codes (400 for a bad request, 404 for an unknown route, 500 for a server-side
failure, never a dead server) and quiet logging.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

MAX_BODY = 8 << 20


def json_server(get: dict[str, Callable[[], dict]], post: dict[str, Callable[[dict], dict]],
                error: Callable[[int, str], dict], host: str, port: int) -> ThreadingHTTPServer:
    """``get``/``post`` map paths to handlers; ``error(code, message)`` shapes error bodies.
    A handler raising ValueError answers 400, any other exception 500."""

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

        def _call(self, fn, *args) -> None:
            try:
                self._send(200, fn(*args))
            except ValueError as exc:  # includes json.JSONDecodeError
                self._send(400, error(400, str(exc)))
            except Exception as exc:  # the server's fault; it keeps serving
                self._send(500, error(500, f"{type(exc).__name__}: {exc}"))

        def do_GET(self):
            fn = get.get(self.path.rstrip("/"))
            if fn is None:
                self._send(404, error(404, f"no route GET {self.path}"))
            else:
                self._call(fn)

        def do_POST(self):
            fn = post.get(self.path.rstrip("/"))
            if fn is None:
                self._send(404, error(404, f"no route POST {self.path}"))
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                n = -1
            if not 0 < n <= MAX_BODY:
                self._send(400, error(400, "a JSON body with a valid Content-Length is required"))
                return
            self._call(lambda: fn(_object(self.rfile.read(n))))

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def _object(raw: bytes) -> dict:
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


def start_in_thread(server: ThreadingHTTPServer) -> str:
    """Serves on a daemon thread; returns ``http://host:port``."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    h, p = server.server_address[:2]
    return f"http://{h}:{p}"
