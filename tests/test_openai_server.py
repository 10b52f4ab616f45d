"""``turngym serve`` against the official ``openai`` package (and raw HTTP for the values
the package would not send): streaming, n, stop, token caps, seeds, content parts,
tool-call history, refused fields, bad values, fairness between requests."""

import json
import socket
import threading
import time

import httpx
import openai
import pytest
import torch

from turngym.agents.openai_server import ChatLimits, ChatModel, serve_in_thread
from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer

CORPUS = ["the quick brown fox jumps over the lazy dog",
          "a judge reads the trajectory and names the role of every turn",
          "hello world how are you today said the agent to the user"]
LIMITS = ChatLimits(max_prompt_tokens=256, max_tokens_cap=800, max_n=4, slice_tokens=4)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    tok = build_tiny_tokenizer(CORPUS, fuse_entities=False)
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0), tok


@pytest.fixture(scope="module")
def served(tiny):
    model, tok = tiny
    server, url = serve_in_thread(ChatModel(model, tok, limits=LIMITS))
    yield url
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


HELLO = [{"role": "user", "content": "hello world"}]


def create(client, **kw):
    kw.setdefault("model", "turngym-local")
    kw.setdefault("messages", HELLO)
    return client.chat.completions.create(**kw)


def streamed(client, **kw):
    """(joined text per choice, finish reason per choice, content chunks, last chunk)."""
    texts, finish, n_content, last = {}, {}, 0, None
    for chunk in create(client, stream=True, **kw):
        last = chunk
        assert chunk.object == "chat.completion.chunk"
        for c in chunk.choices:
            if c.delta.content:
                texts[c.index] = texts.get(c.index, "") + c.delta.content
                n_content += 1
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, n_content, last


def test_plain_completion(client):
    r = create(client, max_completion_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.model == "turngym-local"
    assert r.id.startswith("chatcmpl-") and len(r.choices) == 1
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and msg.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 1 <= r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert [m.id for m in client.models.list().data] == ["turngym-local"]


@pytest.mark.parametrize("kw", [
    {"seed": 5, "max_completion_tokens": 24},
    {"seed": 6, "max_tokens": 30, "n": 3, "temperature": 1.3, "top_p": 0.9},
    {"temperature": 0, "max_completion_tokens": 20, "stop": ["</think>", "quick"]},
])
def test_stream_joined_equals_the_plain_answer(client, kw):
    plain = create(client, **kw)
    texts, finish, n_content, last = streamed(client, stream_options={"include_usage": True},
                                              **kw)
    assert [texts.get(c.index, "") for c in plain.choices] == [c.message.content
                                                                for c in plain.choices]
    assert [finish[c.index] for c in plain.choices] == [c.finish_reason for c in plain.choices]
    assert n_content >= 2 * len(plain.choices) or any(f == "stop" for f in finish.values())
    assert last.choices == [] and last.usage.completion_tokens == plain.usage.completion_tokens
    # the openai package's own accumulator agrees too
    with client.chat.completions.stream(model="m", messages=HELLO, **kw) as s:
        for _ in s:
            pass
        snap = s.current_completion_snapshot
    assert [c.message.content or "" for c in snap.choices] == [c.message.content
                                                              for c in plain.choices]


def test_seed_reproduces_and_different_seeds_differ(client):
    kw = {"max_completion_tokens": 16, "temperature": 1.0}
    a = create(client, seed=11, **kw).choices[0].message.content
    assert create(client, seed=11, **kw).choices[0].message.content == a
    others = {create(client, seed=s, **kw).choices[0].message.content for s in range(3)}
    assert len(others | {a}) > 1


def test_n_choices(client):
    r = create(client, n=3, seed=1, max_completion_tokens=10)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # three samples, not one copied
    assert r.usage.completion_tokens <= 30


def test_stop_cuts_before_the_stop_string(client):
    base = create(client, temperature=0, max_completion_tokens=24).choices[0].message.content
    words = base.split()
    assert len(words) >= 6
    stop = words[4]
    want = base[:base.index(stop)]
    for s in (stop, [stop], ["never-there", stop]):
        r = create(client, temperature=0, max_completion_tokens=24, stop=s)
        assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens < 24
    texts, finish, _, _ = streamed(client, temperature=0, max_completion_tokens=24, stop=stop)
    assert texts.get(0, "") == want and finish[0] == "stop"


def test_token_caps(client):
    for key in ("max_tokens", "max_completion_tokens"):
        r = create(client, temperature=0, **{key: 3})
        assert r.usage.completion_tokens <= 3
        if r.usage.completion_tokens == 3:
            assert r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        create(client, max_tokens=3, max_completion_tokens=4)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        create(client, max_completion_tokens=LIMITS.max_tokens_cap + 1)
    assert e.value.body["param"] == "max_completion_tokens"


def test_content_parts_equal_the_joined_string(client):
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    kw = {"seed": 3, "max_completion_tokens": 12}
    a = create(client, messages=[{"role": "user", "content": parts}], **kw)
    b = create(client, messages=[{"role": "user", "content": "hello\nworld"}], **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    sysparts = [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": "hello"}]
    c = create(client, messages=sysparts, **kw)
    d = create(client, messages=[{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "hello"}], **kw)
    assert c.choices[0].message.content == d.choices[0].message.content


TOOL_HISTORY = [
    {"role": "user", "content": "what is the weather"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Vel Ora"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def test_tool_call_history_is_rendered_not_dropped(client, tiny):
    kw = {"seed": 2, "max_completion_tokens": 12}
    r = create(client, messages=TOOL_HISTORY, **kw)
    assert r.choices[0].message.content
    # the tiny template has no tool_calls support: the call is written as Hermes text
    inline = [TOOL_HISTORY[0], {"role": "assistant", "content": '<tool_call>\n{"name": '
                                '"weather", "arguments": {"city": "Vel Ora"}}\n</tool_call>'},
              TOOL_HISTORY[2]]
    same = create(client, messages=inline, **kw)
    assert same.choices[0].message.content == r.choices[0].message.content
    assert same.usage.prompt_tokens == r.usage.prompt_tokens
    dropped = create(client, messages=[TOOL_HISTORY[0], {"role": "assistant", "content": ""},
                                       TOOL_HISTORY[2]], **kw)
    assert dropped.usage.prompt_tokens < r.usage.prompt_tokens
    # a template that renders tool_calls gets them as structured data
    model, tok = tiny
    tok2 = build_tiny_tokenizer(CORPUS + ["call weather city vel ora sunny"], fuse_entities=False)
    tok2.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}"
        "{% for c in m.get('tool_calls', []) %} CALL {{ c['function']['name'] }} "
        "{{ c['function']['arguments']['city'] }}{% endfor %} {% endfor %}<|assistant|>")
    chat = ChatModel(model, tok2, limits=LIMITS)
    prompt = tok2.decode(chat.parse({"messages": TOOL_HISTORY}).prompt)
    assert "call weather vel ora" in prompt


UNSUPPORTED = [
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("tool_choice", {"tool_choice": "auto"}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("logprobs", {"logprobs": True}),
    ("top_logprobs", {"top_logprobs": 2}),
    ("logit_bias", {"logit_bias": {"5": 10}}),
    ("functions", {"functions": [{"name": "f", "parameters": {}}]}),
    ("function_call", {"function_call": "auto"}),
    ("presence_penalty", {"presence_penalty": 0.5}),
    ("frequency_penalty", {"frequency_penalty": 1.0}),
    ("parallel_tool_calls", {"parallel_tool_calls": False}),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}}),
    ("modalities", {"modalities": ["text", "audio"]}),
    ("prediction", {"prediction": {"type": "content", "content": "x"}}),
    ("reasoning_effort", {"reasoning_effort": "low"}),
    ("web_search_options", {"web_search_options": {}}),
    ("verbosity", {"verbosity": "low"}),
    ("store", {"store": True}),
    ("metadata", {"metadata": {"k": "v"}}),
    ("service_tier", {"service_tier": "flex"}),
    ("messages[0].content[1].type", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
    ("messages[0].name", {"messages": [{"role": "user", "content": "hi", "name": "bob"}]}),
    ("messages[0].role", {"messages": [{"role": "function", "content": "x", "name": "f"}]}),
    ("messages[1].refusal", {"messages": HELLO + [{"role": "assistant", "content": "x",
                                                   "refusal": "no"}]}),
    ("best_of", {"extra_body": {"best_of": 2}}),
]


@pytest.mark.parametrize("param,kw", UNSUPPORTED, ids=[p for p, _ in UNSUPPORTED])
def test_unsupported_fields_are_refused_by_name(client, param, kw):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, max_completion_tokens=2, **kw)
    body = e.value.body
    assert body["param"] == param and body["type"] == "invalid_request_error"
    assert param.split(".")[-1].split("[")[0] in body["message"] or "content parts" in \
        body["message"] or "role" in body["message"]
    assert body["code"] in ("unsupported_parameter", "unsupported_value", "unknown_parameter")


def test_no_op_values_and_nulls_are_accepted(client):
    base = create(client, seed=4, max_completion_tokens=8).choices[0].message.content
    for kw in ({"logprobs": False}, {"response_format": {"type": "text"}},
               {"presence_penalty": 0}, {"frequency_penalty": 0.0}, {"top_p": None},
               {"temperature": None}, {"n": None}, {"stop": None}, {"user": "u1"},
               {"tools": None}, {"modalities": ["text"]}, {"store": False}):
        assert create(client, seed=4, max_completion_tokens=8, **kw
                      ).choices[0].message.content == base, kw


BAD = [
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', "temperature"),
    ({"temperature": -0.5}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"temperature": 2.5}, "temperature"), ({"temperature": True}, "temperature"),
    ({"top_p": 1.5}, "top_p"), ({"top_p": -0.1}, "top_p"), ({"top_p": "x"}, "top_p"),
    ({"max_tokens": True}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"), ({"max_tokens": "5"}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"n": 0}, "n"), ({"n": 5}, "n"), ({"n": True}, "n"),
    ({"seed": 1.5}, "seed"), ({"seed": False}, "seed"), ({"seed": 1 << 64}, "seed"),
    ({"stop": ""}, "stop"), ({"stop": [1]}, "stop"), ({"stop": ["a"] * 5}, "stop"),
    ({"stop": {"a": 1}}, "stop"), ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"model": 3}, "model"),
    ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
    ({"messages": None}, "messages"), ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom",
                                                         "custom": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].type"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[p for _, p in BAD])
def test_bad_values_get_an_openai_style_400(served, body, param):
    if isinstance(body, dict):
        body = json.dumps({"messages": HELLO, **body})
    r = httpx.post(f"{served}/chat/completions", content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    assert err["type"] == "invalid_request_error" and err["message"]


def test_lone_surrogates_get_a_400_naming_where(served, tiny):
    """JSON escapes can carry text no tokenizer accepts (it used to be a 500)."""
    for msgs, param in (([{"role": "user", "content": "caf\ud800"}], "messages[0].content"),
                        ([{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}],
                         "messages[0].content[0].text")):
        r = httpx.post(f"{served}/chat/completions", content=json.dumps({"messages": msgs}),
                       headers={"Content-Type": "application/json"})  # the escape, as sent
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    # whatever else a template renders raw (e.g. a tool call's name): refused at rendering
    from turngym.jsonhttp import HTTPError
    with pytest.raises(HTTPError) as e:
        ChatModel(*tiny, limits=LIMITS).render([{"role": "user", "content": "f\ud83d"}])
    assert e.value.status == 400 and e.value.param == "messages"


def test_a_vanishing_temperature_is_greedy_not_a_500(client):
    greedy = create(client, temperature=0, max_completion_tokens=12).choices[0].message.content
    for t in (1e-300, 1e-45, 1e-6):
        r = create(client, temperature=t, max_completion_tokens=12, seed=3)
        assert r.choices[0].message.content == greedy


def test_the_default_completion_length_respects_the_cap(tiny):
    model, tok = tiny
    chat = ChatModel(model, tok, limits=ChatLimits(max_tokens_cap=5, default_max_tokens=256))
    assert chat.parse({"messages": HELLO}).max_tokens == 5


@pytest.mark.parametrize("raw", [b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                                 b"[1, 2]", b"{bad json", b""])
def test_malformed_bodies_get_400(served, raw):
    r = httpx.post(f"{served}/chat/completions", content=raw)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_prompt_length_is_capped(client):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, messages=[{"role": "user", "content": "hello " * 300}])
    assert e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["param"] == "messages" and "at most 256" in e.value.body["message"]


def test_keep_alive_after_an_early_error(served):
    host, port = served.split("//")[1].split("/")[0].split(":")
    ok = json.dumps({"messages": HELLO, "max_tokens": 2}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        f = s.makefile("rb")
        for path, body in (("/v1/nope", b'{"x": "' + b"y" * 2000 + b'"}'),
                           ("/v1/chat/completions", b'{"messages": [], "pad": "zz"}'),
                           ("/v1/chat/completions", ok)):
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
                      f"Content-Type: application/json\r\n\r\n".encode() + body)
            status = int(f.readline().split()[1])
            headers = {}
            while (line := f.readline().decode().strip()):
                k, _, v = line.partition(":")
                headers[k.lower()] = v.strip()
            payload = json.loads(f.read(int(headers["content-length"])))
            assert headers.get("connection") != "close"
        assert status == 200 and payload["choices"][0]["message"]["content"] is not None


def test_a_long_generation_does_not_block_others(client, served):
    kw = {"temperature": 0, "max_completion_tokens": 300,
          "messages": [{"role": "user", "content": "the quick brown fox"}]}
    chunks, state = [], {}

    def run_long():
        for chunk in create(client, stream=True, **kw):
            chunks.append(time.monotonic())
            if chunk.choices and chunk.choices[0].finish_reason:
                state["finish"] = chunk.choices[0].finish_reason
        state["end"] = time.monotonic()

    t = threading.Thread(target=run_long)
    t.start()
    while len(chunks) < 3:  # the long one is generating
        time.sleep(0.002)
    models = httpx.get(f"{served}/models", timeout=30)  # the event loop is free
    short = create(client, max_completion_tokens=1, temperature=0)
    short_done = time.monotonic()
    n_before = sum(c <= short_done for c in chunks)
    t.join()
    assert models.status_code == 200 and short.usage.completion_tokens == 1
    assert state["finish"] == "length"  # precondition: it really generated 300 tokens
    # the short request was served between two slices of the long one, not after it
    assert short_done < state["end"] and n_before < len(chunks) / 2


def test_serve_cli_with_a_saved_model(tmp_path, tiny):
    import os
    import subprocess
    import sys

    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "turngym", "serve", "--model",
                             str(tmp_path / "m"), "--port", str(port), "--name", "tiny-cli",
                             "--max-prompt-tokens", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        deadline = time.time() + 120
        while True:
            try:
                r = c.chat.completions.create(model="tiny-cli", messages=HELLO, max_tokens=3,
                                              temperature=0)
                break
            except openai.APIConnectionError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.time() < deadline, "server did not come up"
                time.sleep(0.3)
        assert r.model == "tiny-cli" and r.usage.completion_tokens <= 3
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="tiny-cli", messages=[
                {"role": "user", "content": "hello " * 100}])
    finally:
        proc.terminate()
        proc.wait(timeout=20)
