"""Run the app with uvicorn, in the foreground (``minivllm serve``) or in a thread (demo, tests)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from runtime.serving.server.connections import DEFAULT_TIMEOUTS, Timeouts, timed_config


def tcp_socket(host: str, reuse_port: bool = False) -> socket.socket:
    """An unbound TCP socket as uvicorn makes one (IPv6 for a host with a colon; SO_REUSEADDR, so a
    port left in TIME_WAIT is no obstacle). ``reuse_port``: SO_REUSEPORT, for front ends sharing a
    port (every one of them sets it; runtime/serving/server/front_ends.py)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def http_server(app: FastAPI, host: str, port: int, grace_s: float,
                timeouts: Timeouts = DEFAULT_TIMEOUTS) -> uvicorn.Server:
    """The server ``minivllm serve`` runs (each of its front ends): no access log (nothing a request line
    holds is worth keeping), ``grace_s`` for responses in progress at a shutdown, idle connections
    closed on ``timeouts`` (runtime/serving/server/connections.py)."""
    return uvicorn.Server(timed_config(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                      access_log=False, timeout_graceful_shutdown=grace_s),
                                       timeouts))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn in a background thread; ``stop()`` shuts it down gracefully."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int | None = None,
                 timeouts: Timeouts = DEFAULT_TIMEOUTS) -> None:
        self.host, self.port = host, port or free_port(host)
        config = timed_config(uvicorn.Config(app, host=self.host, port=self.port, log_level="warning",
                                             lifespan="off"), timeouts)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="minivllm-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"HTTP server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
