"""An OpenAI-compatible chat-completions server over a local transformers model.

``turngym serve --model DIR --port 8001`` answers ``POST /v1/chat/completions`` and
``GET /v1/models``, so LLM judges (and anything else speaking the OpenAI API, the
official ``openai`` package included) run against a local model on loopback.

What a request may carry (tested with the ``openai`` package, ``tests/test_openai_server.py``):

* ``messages``: roles ``system``, ``developer`` (rendered as ``system``), ``user``,
  ``assistant``, ``tool``; content a string or a list of ``{"type": "text"}`` parts (joined
  with ``\\n``); assistant messages with ``content: null`` and ``tool_calls`` (function
  calls; handed to the chat template when it renders ``tool_calls``, otherwise written
  into the content as Hermes ``<tool_call>`` blocks); tool messages with ``tool_call_id``.
* ``n``, ``stop`` (a string or up to 4), ``max_completion_tokens`` / ``max_tokens``,
  ``temperature`` (0 is greedy), ``top_p``, ``seed`` (same seed, same request: same
  answer, streamed or not), ``stream`` with ``stream_options.include_usage``; ``model``,
  ``user``, ``safety_identifier`` and ``prompt_cache_key`` are accepted without effect
  on the output (one model answers; responses name it).
* Everything else that would change the output (``tools``, ``tool_choice``,
  ``response_format`` other than text, ``logprobs``, ``top_logprobs``, ``logit_bias``,
  penalties, ``functions``, image / audio / file parts, ...) is refused with a 400
  naming the field, as are unknown fields and every ill-typed or out-of-range value.
  A no-op value (``logprobs: false``, ``response_format: {"type": "text"}``,
  ``presence_penalty: 0``) is accepted.  Explicit ``null`` means the default, as in
  OpenAI's API.  Errors are OpenAI-shaped: ``{"error": {"message", "type", "param",
  "code"}}``.

Generation runs on a worker thread, never on the event loop, in slices of
``slice_tokens`` tokens per choice: each slice is one hold of a first-come first-served
lock, so concurrent requests interleave slice by slice and a long request delays a short
one by one slice, not by its whole length.  The same slices feed the SSE stream and the
plain answer, which is why both give the same text under the same seed.  Prompts are
capped (``max_prompt_tokens``, 400 ``context_length_exceeded``), and so are
``max_tokens`` and ``n``, which bounds every request's work.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..jsonhttp import (HTTPError, Limits, Server, disconnected, fifo_lock_hold, is_unicode,
                        json_response, make_app, parse_json, read_json, run_sync)
from .hf_backend import HFPolicy
from .policy import SamplingParams


@dataclass(frozen=True)
class ChatLimits:
    max_prompt_tokens: int = 4096
    max_tokens_cap: int = 1024
    default_max_tokens: int = 256
    max_n: int = 8
    max_stop: int = 4
    slice_tokens: int = 16        # tokens per choice per lock hold
    max_active: int = 8           # requests holding a KV cache at once; others queue
    http: Limits = Limits(max_body_bytes=8 << 20)

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_tokens_cap", "default_max_tokens", "max_n",
                     "max_stop", "slice_tokens", "max_active"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")


# ------------------------------------------------------------------ request fields
GREEDY_BELOW = 1e-5  # a smaller temperature is greedy decoding (vLLM's _SAMPLING_EPS too)
SUPPORTED = {"messages", "model", "n", "stop", "max_tokens", "max_completion_tokens",
             "temperature", "top_p", "seed", "stream", "stream_options", "user",
             "safety_identifier", "prompt_cache_key"}
# fields we do not implement, with the values that mean "off" (accepted as no-ops)
NO_OP = {
    "frequency_penalty": lambda v: v == 0 and not isinstance(v, bool),
    "presence_penalty": lambda v: v == 0 and not isinstance(v, bool),
    "logprobs": lambda v: v is False,
    "response_format": lambda v: v == {"type": "text"},
    "modalities": lambda v: v == ["text"],
    "store": lambda v: v is False,
    "service_tier": lambda v: v in ("auto", "default"),
    "logit_bias": lambda v: v == {},
}
REFUSED = {"tools", "tool_choice", "functions", "function_call", "top_logprobs", "audio",
           "prediction", "reasoning_effort", "web_search_options", "verbosity", "metadata",
           "parallel_tool_calls", "moderation", "prompt_cache_options",
           "prompt_cache_retention"}
MESSAGE_KEYS = {
    "system": {"role", "content"}, "developer": {"role", "content"},
    "user": {"role", "content"}, "assistant": {"role", "content", "tool_calls"},
    "tool": {"role", "content", "tool_call_id"},
}


def bad(param: str | None, message: str, code: str = "invalid_value") -> HTTPError:
    return HTTPError(400, message, param=param, code=code)


def _int(body: dict, key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise bad(key, f"'{key}' must be an integer, got {type(v).__name__}", "invalid_type")
    if not lo <= v <= hi:
        raise bad(key, f"'{key}' must be in [{lo}, {hi}], got {v}")
    return v


def _number(body: dict, key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise bad(key, f"'{key}' must be a number, got {type(v).__name__}", "invalid_type")
    if not math.isfinite(v) or not lo <= v <= hi:
        raise bad(key, f"'{key}' must be a finite number in [{lo:g}, {hi:g}], got {v}")
    return float(v)


def _unicode(text: str, where: str) -> str:
    """``text``, or a 400 naming ``where`` when it is not valid Unicode."""
    if not is_unicode(text):
        raise bad(where, f"'{where}' is not valid Unicode (a lone surrogate escape)")
    return text


def _text(content: Any, where: str, allow_null: bool = False) -> str | None:
    """A message's content as one string: a string, or text parts joined by newlines."""
    if content is None:
        if allow_null:
            return None
        raise bad(where, f"'{where}' must be a string or a list of text parts", "invalid_type")
    if isinstance(content, str):
        return _unicode(content, where)
    if not isinstance(content, list) or not content:
        raise bad(where, f"'{where}' must be a string or a non-empty list of text parts",
                  "invalid_type")
    texts = []
    for j, part in enumerate(content):
        p = f"{where}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad(p, f"'{p}' must be an object with a 'type'", "invalid_type")
        if part["type"] != "text":
            raise bad(f"{p}.type", f"content parts of type {part['type']!r} are not supported "
                                   f"by this server (text parts only)", "unsupported_value")
        if set(part) - {"type", "text"}:
            raise bad(p, f"unsupported keys {sorted(set(part) - {'type', 'text'})} in '{p}'",
                      "unsupported_parameter")
        if not isinstance(part.get("text"), str):
            raise bad(f"{p}.text", f"'{p}.text' must be a string", "invalid_type")
        texts.append(_unicode(part["text"], f"{p}.text"))
    return "\n".join(texts)


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list) or not calls:
        raise bad(where, f"'{where}' must be a non-empty list", "invalid_type")
    out = []
    for j, c in enumerate(calls):
        p = f"{where}[{j}]"
        if not isinstance(c, dict) or c.get("type") != "function":
            raise bad(f"{p}.type", f"'{p}' must be a function tool call "
                                   f"({{'type': 'function', ...}})", "unsupported_value")
        if set(c) - {"id", "type", "function"} or not isinstance(c.get("id"), str):
            raise bad(p, f"'{p}' needs a string 'id', 'type' and 'function' and nothing else")
        fn = c.get("function")
        if (not isinstance(fn, dict) or set(fn) - {"name", "arguments"}
                or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str)):
            raise bad(f"{p}.function", f"'{p}.function' must be {{'name': str, "
                                       f"'arguments': str (JSON)}}", "invalid_type")
        try:
            args = parse_json(fn["arguments"].encode())
        except HTTPError as exc:
            raise bad(f"{p}.function.arguments", f"'{p}.function.arguments': {exc.message}")
        if not isinstance(args, dict):
            raise bad(f"{p}.function.arguments",
                      f"'{p}.function.arguments' must encode a JSON object")
        out.append({"id": c["id"], "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_messages(msgs: Any, template_renders_tool_calls: bool) -> list[dict]:
    """OpenAI messages -> the ``{role, content, ...}`` dicts a chat template renders."""
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "'messages' must be a non-empty list", "invalid_type")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(where, f"'{where}' must be an object with a string 'role'", "invalid_type")
        role = m["role"]
        if role not in MESSAGE_KEYS:
            raise bad(f"{where}.role", f"role {role!r} is not supported (one of "
                                       f"{sorted(MESSAGE_KEYS)})", "unsupported_value")
        extra = sorted(set(m) - MESSAGE_KEYS[role])
        if extra:
            raise bad(f"{where}.{extra[0]}", f"'{where}.{extra[0]}' is not supported by this "
                                             f"server for {role} messages",
                      "unsupported_parameter")
        if role == "assistant":
            calls = _tool_calls(m["tool_calls"], f"{where}.tool_calls") \
                if m.get("tool_calls") is not None else []
            content = _text(m.get("content"), f"{where}.content", allow_null=bool(calls))
            msg: dict = {"role": "assistant", "content": content or ""}
            if calls and template_renders_tool_calls:
                msg["tool_calls"] = calls
            elif calls:  # Hermes form, as turngym's tool envs expect it
                blocks = "\n".join("<tool_call>\n" + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                    + "\n</tool_call>" for c in calls)
                msg["content"] = f"{content}\n{blocks}" if content else blocks
            out.append(msg)
            continue
        content = _text(m.get("content"), f"{where}.content")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise bad(f"{where}.tool_call_id", f"'{where}.tool_call_id' must be a string",
                          "invalid_type")
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


@dataclass
class ChatRequest:
    prompt: list[int]
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


# ------------------------------------------------------------------ generation
@dataclass
class Generation:
    """The choices of one request, advanced one slice at a time (:meth:`step`, on a worker
    thread, under the server's lock)."""

    chat: "ChatModel"
    req: ChatRequest
    ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.req.n
        self.policy = HFPolicy(self.chat.model, self.chat.tok,
                               generator_seed=self.req.seed % (1 << 64))
        self.session = None
        self.ids, self.texts, self.finish = [[] for _ in range(n)], [""] * n, [None] * n

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finish)

    def step(self) -> None:
        req, k = self.req, self.chat.limits.slice_tokens
        first = self.session is None
        if first:
            self.session = self.policy.open_session(req.n)
        rows = [r for r in range(req.n) if self.finish[r] is None]
        greedy = req.temperature == 0 or req.top_p == 0
        params = SamplingParams(k, req.temperature if not greedy else 1.0,
                                req.top_p if not greedy else 1.0, greedy=greedy)
        samples = self.session.generate(
            rows, [list(req.prompt) if first else [] for _ in rows], params,
            [min(k, req.max_tokens - len(self.ids[r])) for r in rows])
        for r, s in zip(rows, samples):
            start = len(self.ids[r])
            self.ids[r].extend(s.token_ids)
            text = self.policy.decode(self.ids[r])
            cut = self._stop_at(text, len(self.texts[r]))
            if cut is not None:
                # keep the tokens up to the first that completes the stop string
                for n in range(start + 1, len(self.ids[r]) + 1):
                    if self._stop_at(self.policy.decode(self.ids[r][:n]), 0) is not None:
                        del self.ids[r][n:]
                        break
                self.texts[r], self.finish[r] = text[:cut], "stop"
            else:
                self.texts[r] = text
                if s.stopped:
                    self.finish[r] = "stop"
                elif len(self.ids[r]) >= req.max_tokens:
                    self.finish[r] = "length"

    def _stop_at(self, text: str, checked: int) -> int | None:
        """Index of the earliest stop string in ``text`` (searching from a little before
        ``checked``, the length already known to hold none)."""
        best = None
        for s in self.req.stop:
            i = text.find(s, max(0, checked - len(s) + 1))
            if i >= 0 and (best is None or i < best):
                best = i
        return best

    def visible(self, r: int) -> str:
        """Text of choice ``r`` that no later token can change: all of it once finished;
        otherwise without a tail that may still become a stop string or is an incomplete
        multi-byte character."""
        text = self.texts[r]
        if self.finish[r] is not None:
            return text
        hold = max((len(s) for s in self.req.stop), default=1) - 1
        text = text[:len(text) - hold] if hold else text
        return text.rstrip("\ufffd")

    def usage(self) -> dict:
        done = sum(len(x) for x in self.ids)
        return {"prompt_tokens": len(self.req.prompt), "completion_tokens": done,
                "total_tokens": len(self.req.prompt) + done}


class ChatModel:
    """A transformers model and tokenizer served as one OpenAI chat model."""

    def __init__(self, model, tokenizer, name: str = "turngym-local", seed: int = 0,
                 limits: ChatLimits = ChatLimits()):
        self.model, self.tok, self.name, self.limits = model.eval(), tokenizer, name, limits
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.renders_tool_calls = "tool_calls" in str(getattr(tokenizer, "chat_template", "")
                                                      or "")
        self._seeds = random.Random(seed)  # per-request seeds when a request gives none

    def parse(self, body: dict) -> ChatRequest:
        """Validates a request body; :class:`HTTPError` 400 naming the field otherwise."""
        lim = self.limits
        for key in body:
            if key in SUPPORTED:
                continue
            if key in NO_OP:
                if body[key] is None or NO_OP[key](body[key]):
                    continue
                raise bad(key, f"'{key}' = {json.dumps(body[key])[:80]} is not supported by "
                               f"this server", "unsupported_parameter")
            if key in REFUSED:
                if body[key] is None:
                    continue
                raise bad(key, f"'{key}' is not supported by this server",
                          "unsupported_parameter")
            raise bad(key, f"unrecognized request argument supplied: {key}",
                      "unknown_parameter")
        for key in ("model", "user", "safety_identifier", "prompt_cache_key"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise bad(key, f"'{key}' must be a string", "invalid_type")
        msgs = parse_messages(body.get("messages"), self.renders_tool_calls)
        n = _int(body, "n", 1, lim.max_n) or 1
        mt = _int(body, "max_tokens", 1, lim.max_tokens_cap)
        mct = _int(body, "max_completion_tokens", 1, lim.max_tokens_cap)
        if mt is not None and mct is not None and mt != mct:
            raise bad("max_tokens", "'max_tokens' and 'max_completion_tokens' differ; give one")
        temperature = _number(body, "temperature", 0.0, 2.0)
        if temperature is not None and temperature < GREEDY_BELOW:
            temperature = 0.0  # the limit T -> 0; logits / 1e-45 would overflow to inf
        top_p = _number(body, "top_p", 0.0, 1.0)
        seed = _int(body, "seed", -(1 << 63), (1 << 64) - 1)
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise bad("stop", "'stop' must be a non-empty string or a list of them",
                      "invalid_type")
        if len(stop) > lim.max_stop:
            raise bad("stop", f"at most {lim.max_stop} stop sequences")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise bad("stream", "'stream' must be true or false", "invalid_type")
        opts = body.get("stream_options")
        include_usage = False
        if opts is not None:
            if not stream:
                raise bad("stream_options", "'stream_options' is only allowed with stream: true")
            if not isinstance(opts, dict) or set(opts) - {"include_usage", "include_obfuscation"}:
                raise bad("stream_options", "'stream_options' supports 'include_usage' only",
                          "unsupported_parameter")
            if opts.get("include_obfuscation") not in (None, False):
                raise bad("stream_options.include_obfuscation",
                          "'include_obfuscation' is not supported", "unsupported_value")
            include_usage = opts.get("include_usage", False)
            if not isinstance(include_usage, bool):
                raise bad("stream_options.include_usage", "'include_usage' must be a boolean",
                          "invalid_type")
        prompt = self.render(msgs)
        if len(prompt) > lim.max_prompt_tokens:
            raise bad("messages", f"the prompt has {len(prompt)} tokens; this server accepts "
                                  f"at most {lim.max_prompt_tokens}", "context_length_exceeded")
        room = (self.context - len(prompt)) if self.context else lim.max_tokens_cap
        asked = mct if mct is not None else mt
        if asked is None:
            asked = min(lim.default_max_tokens, lim.max_tokens_cap, room)
        if asked < 1 or asked > room:
            raise bad("messages", f"the prompt ({len(prompt)} tokens) plus {asked} completion "
                                  f"tokens exceeds the model's context of {self.context}",
                      "context_length_exceeded")
        return ChatRequest(prompt, n, asked, 1.0 if temperature is None else temperature,
                           1.0 if top_p is None else top_p,
                           self._seeds.getrandbits(63) if seed is None else seed,
                           tuple(stop), bool(stream), include_usage)

    def render(self, msgs: list[dict]) -> list[int]:
        from jinja2.exceptions import TemplateError

        try:
            text = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        except TemplateError as exc:
            raise bad("messages", f"the model's chat template refused the messages: {exc}")
        _unicode(text, "messages")  # anything else the messages carried (tool-call fields)
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise bad("messages", "the messages render to an empty prompt")
        return ids


# ------------------------------------------------------------------ HTTP
def _error_body(status: int, message: str, param: str | None, code: str | None) -> dict:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def make_app_for(chat: ChatModel):
    lock = asyncio.Lock()                       # one model: one forward at a time
    active = asyncio.Semaphore(chat.limits.max_active)

    async def models(request: Request) -> JSONResponse:
        return json_response(200, {"object": "list", "data": [
            {"id": chat.name, "object": "model", "created": 0, "owned_by": "turngym"}]})

    async def completions(request: Request) -> Response:
        body = await read_json(request, chat.limits.http)
        req = await run_sync(chat.parse, body)  # tokenising a long prompt: off the loop
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": chat.name}
        if req.stream:
            return StreamingResponse(_stream(request, req, head),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        async with active:
            gen = Generation(chat, req)
            while not gen.done:
                if gen.session is not None and await disconnected(request):
                    return json_response(499, _error_body(499, "client closed the request",
                                                          None, None))
                await fifo_lock_hold(lock, gen.step)
        return json_response(200, {
            **head, "object": "chat.completion",
            "choices": [{"index": r, "message": {"role": "assistant", "content": gen.texts[r],
                                                 "refusal": None},
                         "logprobs": None, "finish_reason": gen.finish[r]}
                        for r in range(req.n)],
            "usage": gen.usage()})

    async def _stream(request: Request, req: ChatRequest, head: dict) -> AsyncIterator[str]:
        def event(choices: list[dict], **extra) -> str:
            chunk = {**head, "object": "chat.completion.chunk", "choices": choices, **extra}
            if req.include_usage and "usage" not in chunk:
                chunk["usage"] = None
            return f"data: {json.dumps(chunk)}\n\n"

        def delta(r: int, d: dict, finish: str | None = None) -> dict:
            return {"index": r, "delta": d, "logprobs": None, "finish_reason": finish}

        try:
            async with active:
                gen = Generation(chat, req)
                sent = [""] * req.n
                yield event([delta(r, {"role": "assistant", "content": ""})
                             for r in range(req.n)])
                reported = [False] * req.n
                while not gen.done:
                    await fifo_lock_hold(lock, gen.step)
                    out = []
                    for r in range(req.n):  # one entry per choice: new text, finish
                        if reported[r]:
                            continue
                        vis, d = gen.visible(r), {}
                        if len(vis) > len(sent[r]) and vis.startswith(sent[r]):
                            d, sent[r] = {"content": vis[len(sent[r]):]}, vis
                        reported[r] = gen.finish[r] is not None
                        if d or reported[r]:
                            out.append(delta(r, d, gen.finish[r]))
                    if out:
                        yield event(out)
                if req.include_usage:
                    yield event([], usage=gen.usage())
            yield "data: [DONE]\n\n"
        except Exception as exc:  # after the 200 head: report in-band, as OpenAI does
            yield "data: " + json.dumps(_error_body(500, f"{type(exc).__name__}: {exc}", None,
                                                    "server_error")) + "\n\n"

    return make_app([("GET", "/v1/models", models),
                     ("POST", "/v1/chat/completions", completions)], _error_body)


def make_server(chat: ChatModel, host: str = "127.0.0.1", port: int = 8001) -> Server:
    """A server bound to ``(host, port)`` (port 0: any free port); ``start()`` runs it on a
    thread, ``serve_forever()`` in this one, ``stop()`` ends it."""
    return Server(make_app_for(chat), host, port, chat.limits.http)


def serve_in_thread(chat: ChatModel, host: str = "127.0.0.1", port: int = 0
                    ) -> tuple[Server, str]:
    """Starts a server on a daemon thread; returns it and its ``.../v1`` base URL."""
    server = make_server(chat, host, port)
    return server, server.start() + "/v1"


