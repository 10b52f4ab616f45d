"""Transport behaviour of turngym's servers (turngym/jsonhttp.py), attacked with raw
sockets and a ``requests.Session`` (what SkyRL-gym's search tool shares per host):
keep-alive after early answers, body caps, slow and idle clients, hostile JSON."""

import json
import socket
import threading
import time

import pytest
import requests

from turngym.envs.search.data import Passage
from turngym.envs.search.retrieval import Hit
from turngym.envs.search.server import RetrieverLimits, serve_in_thread
from turngym.jsonhttp import Limits


class Echo:
    """A retriever whose answer is a function of the query (no index needed)."""

    def search(self, queries, topk):
        return [[Hit(Passage(f"{q}-{i}", q, f"text {i}"), 1.0 / (i + 1)) for i in range(topk)]
                for q in queries]


@pytest.fixture(scope="module")
def server():
    limits = RetrieverLimits(http=Limits(max_body_bytes=4096, header_timeout_s=0.5,
                                         keep_alive_s=0.5, body_timeout_s=0.5))
    srv, url = serve_in_thread(Echo(), num_passages=0, limits=limits)
    yield srv
    srv.stop()


def _request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{extra}"
    if body or method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _read_response(f):
    """(status, headers, body) of one HTTP/1.1 response read from a socket file."""
    status_line = f.readline()
    if not status_line:
        return None
    status = int(status_line.split()[1])
    headers = {}
    while True:
        line = f.readline().decode().strip()
        if not line:
            break
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = f.read(int(headers.get("content-length", "0")))
    return status, headers, body


def _connect(srv, timeout=5.0):
    s = socket.create_connection(srv.server_address, timeout=timeout)
    return s, s.makefile("rb")


def _closed(sock, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (reads EOF)."""
    sock.settimeout(within)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (socket.timeout, TimeoutError):
        return False
    except ConnectionResetError:
        return True


GOOD = json.dumps({"query": "alpha", "topk": 1}).encode()


@pytest.mark.parametrize("first,status", [
    (_request("GET", "/nope"), 404),
    (_request("POST", "/nope", b'{"queries": ["q"], "pad": "' + b"x" * 1000 + b'"}'), 404),
    (_request("PUT", "/retrieve", b'{"queries": ["q"]}'), 405),
    (_request("POST", "/retrieve", b"{not json"), 400),
    (_request("POST", "/retrieve", b'{"queries": [1]}'), 400),
    (_request("POST", "/retrieve", b'{"queries": ["q"], "topk": true}'), 400),
])
def test_an_early_answer_leaves_the_connection_usable(server, first, status):
    s, f = _connect(server)
    with s:
        s.sendall(first)
        st, headers, body = _read_response(f)
        assert st == status and "error" in json.loads(body)
        assert headers.get("connection") != "close"
        s.sendall(_request("POST", "/retrieve", GOOD))  # same connection
        st, _, body = _read_response(f)
        assert st == 200, body
        assert json.loads(body)["result"][0][0]["id"] == "alpha-0"


def test_pipelined_requests_after_an_unread_body_are_parsed_in_order(server):
    s, f = _connect(server)
    with s:
        s.sendall(_request("POST", "/nope", b'{"x": "' + b"y" * 500 + b'"}')
                  + _request("POST", "/retrieve", GOOD) + _request("GET", "/health"))
        assert [_read_response(f)[0] for _ in range(3)] == [404, 200, 200]


def test_oversized_bodies_get_413_and_the_connection_closes(server):
    big = json.dumps({"queries": ["q" * 5000]}).encode()
    s, f = _connect(server)
    with s:  # declared too large: refused before reading
        s.sendall(_request("POST", "/retrieve", big))
        st, headers, body = _read_response(f)
        assert st == 413 and headers["connection"] == "close"
        assert "4096 bytes" in json.loads(body)["error"]
        assert _closed(s, 2.0)
    s, f = _connect(server)
    with s:  # chunked (no length): refused once past the cap
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(5):
            s.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")
        st, headers, _ = _read_response(f)
        assert st == 413 and headers["connection"] == "close"
        assert _closed(s, 2.0)


def test_an_early_answer_to_a_large_or_chunked_body_closes_the_connection(server):
    """Never reads an unbounded body for nothing: past DRAIN_LIMIT, or chunked, the
    early answer says Connection: close (and the server does close)."""
    for head, body in (
            (b"POST /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n", b"x" * 1000),
            (b"POST /nope HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
             b"3e8\r\n" + b"x" * 1000 + b"\r\n")):
        s, f = _connect(server)
        with s:
            s.sendall(head + body)
            st, headers, _ = _read_response(f)
            assert st == 404 and headers["connection"] == "close"
            assert _closed(s, 2.0)


def test_requests_session_reuses_the_connection_exactly_when_safe(server):
    url = server.url

    def post(sess, path, **kw):
        r = sess.post(f"{url}{path}", stream=True, **kw)
        sock = r.raw.connection.sock  # None: already closed (Connection: close)
        port = sock.getsockname()[1] if sock is not None else None
        r.content  # read it all: the connection goes back to the pool
        return r, port

    with requests.Session() as sess:  # SkyRL-gym: one shared Session per host
        r1, p1 = post(sess, "/nope", json={"queries": ["x"]})
        r2, p2 = post(sess, "/retrieve", json={"query": "a"})
        assert (r1.status_code, r2.status_code) == (404, 200)
        assert p1 == p2  # the 404 did not cost the connection
        r3, p3 = post(sess, "/retrieve", data=b"x" * 5000,
                      headers={"Content-Type": "application/json"})
        assert r3.status_code == 413 and r3.headers["connection"] == "close"
        r4, p4 = post(sess, "/retrieve", json={"query": "b", "topk": 2})
        assert r4.status_code == 200
        assert [d["id"] for d in r4.json()["result"][0]] == ["b-0", "b-1"]
        assert p3 is None and p4 not in (None, p2)  # the 413 closed it: a fresh one


def test_idle_and_slow_clients_are_cut_off(server):
    s, _ = _connect(server)
    with s:  # connects, never sends
        assert _closed(s, 3.0)
    s, _ = _connect(server)
    with s:  # trickles a request head, one byte at a time (would reset an idle timer)
        stop = threading.Event()

        def trickle():
            for ch in b"POST /retrieve HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 200:
                if stop.is_set():
                    return
                try:
                    s.send(bytes([ch]))
                except OSError:
                    return
                time.sleep(0.05)

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        t0 = time.monotonic()
        closed = _closed(s, 5.0)
        stop.set()
        assert closed and time.monotonic() - t0 < 4.0
    s, f = _connect(server)
    with s:  # a complete head, then a body that never finishes
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"q")
        st, headers, body = _read_response(f)
        assert st == 408 and headers["connection"] == "close"
        assert _closed(s, 2.0)
    s, f = _connect(server)
    with s:  # keep-alive after a good request, then idle
        s.sendall(_request("GET", "/health"))
        assert _read_response(f)[0] == 200
        assert _closed(s, 3.0)


@pytest.mark.parametrize("raw", [
    b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",   # past Python's recursion
    b'{"queries": ' + b"[" * 40 + b"]" * 40 + b"}",              # past the depth cap
    b'{"queries": ["\xff\xfe"]}',                                 # not UTF-8
    b"[]", b'"x"', b"", b"NaN",
])
def test_hostile_json_gets_400_not_500(raw):
    srv, url = serve_in_thread(Echo(), limits=RetrieverLimits(http=Limits(max_body_bytes=1 << 20)))
    try:
        r = requests.post(f"{url}/retrieve", data=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert isinstance(r.json()["error"], str)
        assert requests.get(f"{url}/health").status_code == 200
    finally:
        srv.stop()


def test_garbage_on_the_wire_gets_400_and_the_server_goes_on(server):
    s, f = _connect(server)
    with s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        st = _read_response(f)
        assert st is None or st[0] == 400
    assert requests.get(f"{server.url}/health").status_code == 200


def test_server_starts_on_port_zero_and_stops_cleanly():
    srv, url = serve_in_thread(Echo())
    port = srv.server_address[1]
    assert port != 0 and url.endswith(f":{port}")
    assert requests.get(f"{url}/health").json() == {"status": "ok", "passages": None}
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 5 and not srv.thread.is_alive()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/health", timeout=2)
