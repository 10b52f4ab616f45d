"""A small OpenAI-compatible chat-completions server over a local transformers model.

``turngym serve --model DIR --port 8001`` answers ``POST /v1/chat/completions``
(``messages``, ``max_tokens``, ``temperature``; ``temperature: 0`` is greedy) and
``GET /v1/models``, so LLM judges (and anything else speaking the OpenAI API) can
run against a local model on loopback: tests use it as a real HTTP judge.

The chat template of the model's tokenizer renders the messages; generation runs
through the same :class:`HFPolicy` as rollouts, one request at a time (a lock),
with a fixed sampler seed so answers are reproducible.  Malformed requests get a
400 with an OpenAI-style ``{"error": {"message": ...}}`` body.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .hf_backend import HFPolicy
from .policy import SamplingParams

MAX_BODY = 4 << 20


class ChatModel:
    def __init__(self, model, tokenizer, name: str = "turngym-local", seed: int = 0,
                 max_tokens_cap: int = 1024):
        self.policy = HFPolicy(model, tokenizer, generator_seed=seed)
        self.tok, self.name, self.cap = tokenizer, name, max_tokens_cap
        self._lock = threading.Lock()

    def complete(self, body: dict) -> dict:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in msgs):
            raise ValueError("'messages' must be a non-empty list of {role, content} objects")
        max_tokens = body.get("max_tokens", 256)
        temperature = body.get("temperature", 1.0)
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.cap:
            raise ValueError(f"'max_tokens' must be an integer in [1, {self.cap}]")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError("'temperature' must be a number >= 0")
        ids = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = list(self.tok(ids, add_special_tokens=False)["input_ids"])
        params = SamplingParams(max_tokens, float(temperature) or 1.0,
                                float(body.get("top_p", 1.0)), greedy=temperature == 0)
        with self._lock:
            sample = self.policy.generate([ids], params)[0]
        text = self.policy.decode(sample.token_ids)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
                "created": int(time.time()), "model": self.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop" if sample.stopped else "length"}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(sample.token_ids),
                          "total_tokens": len(ids) + len(sample.token_ids)}}


def make_server(chat: ChatModel, host: str = "127.0.0.1", port: int = 8001) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, msg: str) -> None:
            self._send(code, {"error": {"message": msg, "type": "invalid_request_error"
                                        if code < 500 else "server_error"}})

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": chat.name, "object": "model", "owned_by": "turngym"}]})
            else:
                self._error(404, f"no route GET {self.path}")

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route POST {self.path}")
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                n = -1
            if not 0 < n <= MAX_BODY:
                self._error(400, "a JSON body with a valid Content-Length is required")
                return
            try:
                body = json.loads(self.rfile.read(n))
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                self._send(200, chat.complete(body))
            except (ValueError, json.JSONDecodeError) as exc:
                self._error(400, str(exc))
            except Exception as exc:
                self._error(500, f"{type(exc).__name__}: {exc}")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_thread(chat: ChatModel, host: str = "127.0.0.1", port: int = 0):
    server = make_server(chat, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    h, p = server.server_address[:2]
    return server, f"http://{h}:{p}/v1"
