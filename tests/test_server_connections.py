"""Connections that send no request are closed on time: an idle fresh connection and a trickling
one once their headers are late, a kept-alive one once it idles past its timeout; requests on other
connections are served meanwhile. (Short timeouts here; deadlines generous, nothing timed to load.)"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from fastapi import FastAPI

from runtime.cli import build_parser
from runtime.cli.serve import timeouts
from runtime.serving.server.connections import DEFAULT_TIMEOUTS, Timeouts
from runtime.serving.server.launch import ServerThread

TIMEOUT = 0.5
DEADLINE = 30.0  # how long a test waits for a close, at most (a busy machine may be slow; never early)


@pytest.fixture(scope="module")
def server():
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict:
        return {"ok": True}

    with ServerThread(app, timeouts=Timeouts(keep_alive_s=TIMEOUT, header_s=TIMEOUT)) as http:
        yield http


def _connect(http: ServerThread) -> socket.socket:
    sock = socket.create_connection((http.host, http.port), timeout=DEADLINE)
    sock.settimeout(0.05)
    return sock


def _closed(sock: socket.socket) -> bool:
    """The server closed it (EOF or reset); False while it is still open."""
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def _wait_closed(socks: list[socket.socket], trickle: bytes = b"") -> float:
    """Seconds until the server closed every one (sending ``trickle`` on each meanwhile)."""
    start, open_ = time.monotonic(), list(socks)
    while open_:
        assert time.monotonic() - start < DEADLINE, f"{len(open_)} of {len(socks)} connections still open"
        for s in list(open_):
            if trickle:
                try:
                    s.sendall(trickle)
                except OSError:  # closed under us
                    open_.remove(s)
                    continue
            if _closed(s):
                open_.remove(s)
        time.sleep(0.02)
    return time.monotonic() - start


def test_idle_fresh_connections_are_closed_after_the_header_timeout(server):
    socks = [_connect(server) for _ in range(50)]
    opened = time.monotonic()
    try:
        _wait_closed(socks)
        assert time.monotonic() - opened >= TIMEOUT * 0.9  # not before it (a timer never fires early)
    finally:
        for s in socks:
            s.close()


def test_a_client_trickling_its_headers_is_closed_too(server):
    socks = [_connect(server) for _ in range(10)]
    for s in socks:
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
    try:
        _wait_closed(socks, trickle=b"X")  # a byte at a time of a header that never ends
    finally:
        for s in socks:
            s.close()


def test_a_kept_alive_connection_is_closed_once_idle_past_its_timeout(server):
    with httpx.Client(base_url=server.url, timeout=DEADLINE) as client:
        assert client.get("/ping").json() == {"ok": True}
    sock = _connect(server)
    try:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(DEADLINE)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.settimeout(0.05)
        answered = time.monotonic()
        _wait_closed([sock])
        assert time.monotonic() - answered >= TIMEOUT * 0.9
    finally:
        sock.close()


def test_requests_are_served_while_many_connections_idle(server):
    idle = [_connect(server) for _ in range(200)]
    try:
        with httpx.Client(base_url=server.url, timeout=DEADLINE) as client:
            for _ in range(5):
                assert client.get("/ping").json() == {"ok": True}
    finally:
        for s in idle:
            s.close()


def test_a_request_on_time_is_not_cut(server):
    """Headers sent in pieces but within the timeout: answered (the deadline is for the headers only)."""
    sock = _connect(server)
    try:
        sock.sendall(b"GET /ping HTTP/1.1\r\n")
        sock.sendall(b"Host: x\r\n\r\n")
        sock.settimeout(DEADLINE)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        sock.close()


def test_serve_takes_both_timeouts_as_flags_with_defaults():
    args = build_parser().parse_args(["serve"])
    assert timeouts(args) == DEFAULT_TIMEOUTS and DEFAULT_TIMEOUTS.keep_alive_s > 0 and DEFAULT_TIMEOUTS.header_s > 0
    args = build_parser().parse_args(["serve", "--timeout-keep-alive", "2.5", "--timeout-header", "7"])
    assert timeouts(args) == Timeouts(keep_alive_s=2.5, header_s=7.0)


def test_bench_serve_s_idle_and_trickling_clients_see_the_server_close_them(server):
    """``bench serve --idle-connections / --trickling-connections``: held open beside a replay, each
    is closed by the server once its headers are late, and the report counts them."""
    from runtime.bench.idle_clients import IdleClients

    with IdleClients(server.host, server.port, idle=6, trickling=4) as held:
        start = time.monotonic()
        while held.still_open() and time.monotonic() - start < DEADLINE:
            assert httpx.get(server.url + "/ping", timeout=DEADLINE).json() == {"ok": True}
            time.sleep(0.05)
    report = held.report()
    assert (report.idle, report.trickling, report.refused) == (6, 4, 0)
    assert report.closed == 10 and report.open_at_end == 0
    # the client starts its clock once connected, a moment after the server started the deadline's
    assert TIMEOUT * 0.9 <= report.lifetime_p50_s <= report.lifetime_max_s < DEADLINE
    assert "10 closed by the server" in report.render()


def test_bench_serve_s_connections_are_reported_open_when_the_server_keeps_them(server):
    """Against a server that never closes them (timeouts longer than the hold), none is counted closed."""
    from runtime.bench.idle_clients import IdleClients

    with ServerThread(FastAPI(), timeouts=Timeouts(keep_alive_s=60, header_s=60)) as lax:
        with IdleClients(lax.host, lax.port, idle=3, trickling=2) as held:
            time.sleep(1.5)  # trickling ones have sent a byte or two: a server that took them as done would close
        report = held.report()
    assert (report.closed, report.open_at_end, report.refused) == (0, 5, 0)
    assert report.lifetime_p50_s is None and "none" in report.render()


def test_serve_raises_its_open_files_limit():
    """Every connection is a file: serve lifts its soft limit toward the hard one (65,536 at most)."""
    import resource

    from runtime.serving.server.connections import OPEN_FILES_WANTED, raise_open_files_limit

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(OPEN_FILES_WANTED, hard)
    soft = raise_open_files_limit()
    assert soft == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert soft == resource.RLIM_INFINITY or soft >= wanted


def test_connections_are_parsed_by_httptools(server):
    """The deadline rides on uvicorn's C parser: h11's pure-Python send costs a streamed token about a
    third more of the front end's CPU (scripts/frontend_cost.py)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    sock = _connect(server)
    try:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(DEADLINE)
        assert b"200 OK" in sock.recv(4096)
        connections = list(server.server.server_state.connections)
        assert connections and all(isinstance(c, HttpToolsProtocol) for c in connections)
    finally:
        sock.close()
