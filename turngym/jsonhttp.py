"""The JSON-over-HTTP layer of turngym's servers: starlette on uvicorn.

Both servers (``turngym serve-retriever``, ``turngym serve``) are starlette apps run by
uvicorn, the stack Search-R1's and SkyRL's own retrieval servers use (through
FastAPI).  This module holds what they share:

* :class:`HTTPError` and :func:`endpoint`: a handler raises ``HTTPError(status, message,
  param=..., code=...)`` for the client's mistakes; any other exception is the
  server's fault and answers 500.  Bodies are shaped by the app's ``error_body``.
* :func:`read_json`: the request body with a byte cap (a ``Content-Length`` over it is
  refused before reading, a chunked body as soon as it passes it: 413), a total read
  deadline (408), strict JSON (400, NaN/Infinity literals allowed so that fields can be
  refused by name) and a nesting cap (400).  A 408/413 answer closes the connection.
  Any other answer given before the body was read (404, 405) keeps the connection only
  when the unread rest is small (``DRAIN_LIMIT``): the HTTP parser skips it before the
  next request; a larger or chunked body closes the connection instead (both tested
  with a raw keep-alive socket and a ``requests.Session``).
* :class:`Server`: a uvicorn server bound to an already-open socket, so port 0 works and
  the URL is known before it starts; ``start()`` runs it on a thread (tests),
  ``serve_forever()`` until Ctrl-C (the CLI), ``stop()`` shuts it down cleanly.
* Timeouts for slow or idle clients: a connection that sends nothing is closed after
  ``keep_alive_s`` (uvicorn arms that timer only after a first response; we arm it on
  connect too), a request head must be complete within ``header_timeout_s`` of its
  first byte, a body within ``body_timeout_s``.

Why plain starlette and not FastAPI: the servers validate every field by hand because
the contracts need exact error semantics (OpenAI-style 400 bodies naming the field,
``true`` refused where an integer is asked, NaN refused by name), which pydantic's
lax coercion and FastAPI's 422 bodies would have to be undone for; starlette is the
ASGI toolkit FastAPI is built on, without the extra layer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import anyio
import h11
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("turngym.server")

DRAIN_LIMIT = 64 << 10  # unread body bytes the parser may skip to keep a connection

ErrorBody = Callable[[int, str, "str | None", "str | None"], dict]


@dataclass(frozen=True)
class Limits:
    """Per-connection and per-request bounds shared by the servers."""

    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 30.0      # the whole body must arrive within this
    header_timeout_s: float = 10.0    # a request head, from its first byte
    keep_alive_s: float = 30.0        # an idle connection is closed after this
    max_json_depth: int = 32
    max_connections: int = 1024       # uvicorn answers 503 beyond this

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_json_depth", "max_connections"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("body_timeout_s", "header_timeout_s", "keep_alive_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"{name} must be > 0")


class HTTPError(Exception):
    """A request the server refuses: ``status`` (4xx) with a message naming the cause."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.close = close


def default_error_body(status: int, message: str, param: str | None,
                       code: str | None) -> dict:
    return {"error": message}


def json_response(status: int, payload: Any, close: bool = False) -> JSONResponse:
    return JSONResponse(payload, status_code=status,
                        headers={"Connection": "close"} if close else None)


def error_response(error_body: ErrorBody, exc: HTTPError) -> JSONResponse:
    return json_response(exc.status, error_body(exc.status, exc.message, exc.param, exc.code),
                         close=exc.close)


def endpoint(fn: Callable[[Request], Awaitable[Response]], error_body: ErrorBody
             ) -> Callable[[Request], Awaitable[Response]]:
    """Wraps a handler: ``HTTPError`` -> its status, anything else -> 500 (logged); the
    server keeps serving either way."""

    async def handler(request: Request) -> Response:
        try:
            response = await fn(request)
        except HTTPError as exc:
            response = error_response(error_body, exc)
        except ClientDisconnect:
            return Response(status_code=400, headers={"Connection": "close"})
        except Exception as exc:  # the server's fault, not the client's
            log.exception("%s %s failed", request.method, request.url.path)
            response = json_response(500, error_body(500, f"{type(exc).__name__}: {exc}", None,
                                                     "server_error"))
        return close_if_undrained(request, response)

    return handler


def close_if_undrained(request: Request, response: Response) -> Response:
    """An answer given before the body was read keeps the connection only when the unread
    rest is small (the HTTP parser skips it before the next request); a large or
    chunked (unbounded) body closes the connection instead of being read for nothing."""
    if getattr(request.state, "body_read", False) or "connection" in response.headers:
        return response
    te = request.headers.get("transfer-encoding", "")
    try:
        declared = int(request.headers.get("content-length", "0"))
    except ValueError:
        declared = DRAIN_LIMIT + 1
    if "chunked" in te.lower() or declared > DRAIN_LIMIT:
        response.headers["Connection"] = "close"
    return response


def make_app(routes: list[tuple[str, str, Callable[[Request], Awaitable[Response]]]],
             error_body: ErrorBody = default_error_body) -> Starlette:
    """``routes``: (method, path, handler); unknown paths 404 and wrong methods 405 answer
    JSON bodies shaped by ``error_body`` too."""

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        what = "no route" if exc.status_code == 404 else str(exc.detail)
        return close_if_undrained(request, json_response(exc.status_code, error_body(
            exc.status_code, f"{what}: {request.method} {request.url.path}", None,
            "not_found" if exc.status_code == 404 else "method_not_allowed")))

    return Starlette(routes=[Route(path, endpoint(fn, error_body), methods=[method])
                             for method, path, fn in routes],
                     exception_handlers={StarletteHTTPException: http_error})


# ------------------------------------------------------------------------ body
def _depth_ok(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                return False
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode: JSON's escapes can carry a lone surrogate
    ("\\ud800"), which no tokenizer accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_json(raw: bytes, max_depth: int = 32) -> Any:
    """Strict JSON of a request body: 400 on bad bytes, bad syntax or deep nesting."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise HTTPError(400, f"the JSON body is nested deeper than {max_depth} levels",
                        code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise HTTPError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not _depth_ok(value, max_depth):
        raise HTTPError(400, f"the JSON body is nested deeper than {max_depth} levels",
                        code="invalid_json")
    return value


async def read_body(request: Request, limits: Limits) -> bytes:
    request.state.body_read = True  # read to the end, or answered with Connection: close
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise HTTPError(400, "bad Content-Length header", close=True) from None
        if n > limits.max_body_bytes:
            raise HTTPError(413, f"the body ({n} bytes) is larger than the server's limit of "
                                 f"{limits.max_body_bytes} bytes", code="request_too_large",
                            close=True)
    chunks, size = [], 0
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise HTTPError(413, f"the body is larger than the server's limit of "
                                         f"{limits.max_body_bytes} bytes",
                                    code="request_too_large", close=True)
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPError(408, f"the body did not arrive within {limits.body_timeout_s:g} s",
                        code="request_timeout", close=True) from None
    return b"".join(chunks)


async def read_json(request: Request, limits: Limits) -> dict:
    """The request's JSON object body, within ``limits`` (see the module notes)."""
    raw = await read_body(request, limits)
    if not raw:
        raise HTTPError(400, "a JSON object body is required", code="invalid_json")
    body = parse_json(raw, limits.max_json_depth)
    if not isinstance(body, dict):
        raise HTTPError(400, "the body must be a JSON object", code="invalid_json")
    return body


async def disconnected(request: Request) -> bool:
    """Whether the client went away (checked between units of long work)."""
    try:
        return await request.is_disconnected()
    except Exception:  # pragma: no cover - a transport that cannot tell
        return False


# ---------------------------------------------------------------------- server
def _protocol_class(header_timeout: float) -> type:
    class TimedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol plus two timers it lacks: an opened connection that
        never sends is idle too, and a request head must complete in time (a client
        trickling header bytes would otherwise hold the connection forever)."""

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.head_timer = None
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def data_received(self, data: bytes) -> None:
            if self.head_timer is None and self.conn.their_state is h11.IDLE:
                self.head_timer = self.loop.call_later(header_timeout, self.head_expired,
                                                       self.cycle)
            super().data_received(data)

        def head_expired(self, cycle) -> None:
            self.head_timer = None
            if (self.cycle is cycle and self.conn.their_state is h11.IDLE
                    and not self.transport.is_closing()):
                self.transport.close()  # no complete request head in time

        def connection_lost(self, exc) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
            super().connection_lost(exc)

    return TimedH11Protocol


class Server:
    """A uvicorn server for ``app`` on ``(host, port)`` (port 0: a free port, known at
    once through :attr:`url`)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0,
                 limits: Limits = Limits(), log_level: str = "warning"):
        self.limits = limits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.listen(2048)
        self.sock.setblocking(False)
        config = uvicorn.Config(
            app, http=_protocol_class(limits.header_timeout_s), lifespan="off",
            log_config=None, log_level=log_level, access_log=False,
            timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
            limit_concurrency=limits.max_connections, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def server_address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    @property
    def url(self) -> str:
        h, p = self.server_address
        return f"http://[{h}]:{p}" if ":" in h else f"http://{h}:{p}"

    def start(self, timeout: float = 30.0) -> str:
        """Serves on a daemon thread; returns :attr:`url` once it accepts requests."""
        if self.thread is not None:
            raise RuntimeError("server already started")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True, name=f"turngym-server-{self.url}")
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"server on {self.url} failed to start")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server on {self.url} did not start within {timeout} s")
            time.sleep(0.01)
        return self.url

    def serve_forever(self) -> None:
        """Serves in the calling thread until Ctrl-C / SIGTERM."""
        try:
            self.start()
            while self.thread is not None and self.thread.is_alive():
                self.thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self, timeout: float = 10.0) -> None:
        """Stops accepting, lets running requests finish (at most ~5 s), closes the socket."""
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                self.server.force_exit = True
                self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> "Server":
        if self.thread is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_sync(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Runs blocking work (a model forward, an index search) on a worker thread so the
    event loop keeps serving other connections meanwhile."""
    return anyio.to_thread.run_sync(fn, *args)


async def fifo_lock_hold(lock: asyncio.Lock, fn: Callable[..., Any], *args: Any) -> Any:
    """One bounded unit of work under ``lock``, on a worker thread.  ``asyncio.Lock``
    wakes waiters first-come first-served, and a holder that asks again queues behind
    them, so requests that split their work into units interleave instead of one
    starving the rest."""
    async with lock:
        return await run_sync(fn, *args)
