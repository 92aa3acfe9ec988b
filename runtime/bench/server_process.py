"""``minivllm serve`` in a child process for a benchmark: start it, wait until it is ready, stop it.

The child gets the engine flags given after ``--launch`` and records its event log; stopping sends
SIGINT (uvicorn shuts down gracefully and the log is flushed), then SIGKILL if it hangs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence


class ServerProcess:
    def __init__(self, flags: Sequence[str], *, host: str = "127.0.0.1", port: int = 8000,
                 trace: str | None = None, log_file: str | None = None) -> None:
        self.url = f"http://{host}:{port}"
        self.log_file = log_file
        cmd = [sys.executable, "-m", "runtime", "serve", "--host", host, "--port", str(port), *flags]
        if trace:
            cmd += ["--trace", trace]
        self.cmd = cmd
        self._out = open(log_file, "wb") if log_file else subprocess.DEVNULL  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 900.0, on_wait: Callable[[float], None] | None = None) -> float:
        """Poll ``/ready`` until it answers 200 (the seconds waited); raise if the child exits or time runs out."""
        import httpx

        start = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode} before it was ready"
                                   f"{self._last_words()} (command: {' '.join(self.cmd)})")
            try:
                if httpx.get(self.url + "/ready", timeout=2.0).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            waited = time.monotonic() - start
            if waited > timeout:
                self.stop()
                raise RuntimeError(f"the server was not ready after {timeout:.0f} s")
            if on_wait is not None:
                on_wait(waited)
            time.sleep(0.2)

    def _last_words(self) -> str:
        """The server's last line of output (its one-line error), when it went to a file."""
        if not self.log_file:
            return ""
        try:
            with open(self.log_file, "rb") as f:
                lines = f.read()[-2000:].decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f": {lines[-1]}" if lines else ""

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._out is not subprocess.DEVNULL:
            self._out.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
