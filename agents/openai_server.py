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

import threading
import time
import uuid
from http.server import ThreadingHTTPServer

from ..jsonhttp import json_server, start_in_thread
from .hf_backend import HFPolicy
from .policy import SamplingParams


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
    def error(code: int, msg: str) -> dict:
        kind = "invalid_request_error" if code < 500 else "server_error"
        return {"error": {"message": msg, "type": kind}}

    models = {"object": "list", "data": [{"id": chat.name, "object": "model",
                                          "owned_by": "turngym"}]}
    return json_server(get={"/v1/models": lambda: models},
                       post={"/v1/chat/completions": chat.complete},
                       error=error, host=host, port=port)


def serve_in_thread(chat: ChatModel, host: str = "127.0.0.1", port: int = 0):
    server = make_server(chat, host, port)
    return server, start_in_thread(server) + "/v1"
