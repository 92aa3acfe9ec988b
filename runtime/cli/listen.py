"""``serve``'s listening socket, bound before the model loads.

A port that is taken or not ours to use, or a host that is not this machine's, is a one-line error
naming the flag at once, not after the model has loaded (and with no event log left behind); the
bound socket is then handed to uvicorn, so nothing can take the port in between.
"""

from __future__ import annotations

import errno
import socket

from runtime.cli.errors import CLIError
from runtime.serving.server.launch import tcp_socket


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: any free one), not listening yet, made as uvicorn
    makes one (``tcp_socket``; ``reuse_port``: for front ends sharing the port)."""
    sock = tcp_socket(host, reuse_port)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        reason = e.strerror or str(e)
        if e.errno == errno.EADDRINUSE:
            raise CLIError(f"--port: {host}:{port} is already in use (choose another --port)") from None
        if e.errno == errno.EACCES:
            raise CLIError(f"--port: not allowed to listen on {host}:{port} ({reason})") from None
        raise CLIError(f"--host: cannot listen on {host}:{port} ({reason})") from None
    return sock
