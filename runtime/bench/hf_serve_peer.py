"""HF transformers' own OpenAI server (``transformers serve``) as a peer under ``minivllm bench serve``:
start it on a checkpoint folder (``python -m runtime.bench.hf_checkpoint``), wait for ``/health``, warm
it up (its continuous-batching manager starts on the first request), run a command against it (the
client), stop it, and print the end of its log. Every phase has a time limit; a peer that dies or
hangs ends the run with a message and a non-zero status, never a hang.

    python -m runtime.bench.hf_serve_peer CKPT --device cuda --dtype bfloat16 --port 8012 -- \\
        python3 -m runtime bench serve TRACE --url http://127.0.0.1:8012/v1 --served-model-name CKPT \\
        --text-prompts TOKENIZER --no-ignore-eos --time-limit 90 --json hf_serve.json

What the peer takes (transformers 5.17): ``/v1/completions`` with a text prompt only (token ids: 400),
no field outside OpenAI's schema (``ignore_eos``: 422), ``max_tokens`` as ``max_new_tokens``, the model
named exactly as it was started (the folder as given; ``/v1/models`` lists only the hub cache). Its
streams end without ``data: [DONE]``. Eos is disabled in the checkpoint's generation config instead of
per request, so each request generates its ``max_tokens``.

Exit status: the command's; 2 when the peer did not come up, 3 when the warm-up failed, 124 when the
command ran past ``--run-timeout``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NOT_READY, WARMUP_FAILED, TIMED_OUT = 2, 3, 124


def serve_command(checkpoint: str, *, host: str = "127.0.0.1", port: int = 8012, device: str = "auto",
                  dtype: str = "auto", continuous_batching: bool = True, extra: Sequence[str] = ()) -> list[str]:
    """``transformers serve`` preloading ``checkpoint`` (its force_model: every request must name it)."""
    return [sys.executable, "-m", "transformers.cli.transformers", "serve", checkpoint,
            "--continuous-batching" if continuous_batching else "--no-continuous-batching",
            "--device", device, "--dtype", dtype, "--host", host, "--port", str(port), *extra]


def peer_env() -> dict[str, str]:
    """No hub traffic: no update check, local files only."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}


class PeerProcess:
    """The server in a child process of its own session (stopped with all its threads and children)."""

    def __init__(self, cmd: Sequence[str], url: str, log_file: str | Path) -> None:
        self.cmd, self.url, self.log_file = list(cmd), url.rstrip("/"), Path(log_file)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log_file, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=subprocess.STDOUT, env=peer_env(),
                                     start_new_session=True)

    def wait_ready(self, timeout: float) -> float:
        """Seconds until ``/health`` answered 200; RuntimeError if the child exits or time runs out."""
        import httpx

        start = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the peer exited with status {self.proc.returncode} before it was ready")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"the peer did not answer {self.url}/health within {timeout:.0f} s")
            time.sleep(0.5)

    def warm_up(self, model: str, requests: int = 4, max_tokens: int = 16, timeout: float = 120.0) -> float:
        """One request alone (it starts the continuous-batching manager), then ``requests - 1`` at once;
        each must come back with ``max_tokens`` completion tokens (eos off). Seconds taken."""
        import httpx

        start = time.monotonic()

        def one(i: int) -> None:
            body = {"model": model, "prompt": f"Warm-up request {i}: " + "the quick brown fox " * (4 + 8 * i),
                    "max_tokens": max_tokens, "temperature": 0, "stream": False}
            left = max(1.0, timeout - (time.monotonic() - start))
            resp = httpx.post(f"{self.url}/v1/completions", json=body, timeout=left)
            if resp.status_code != 200:
                raise RuntimeError(f"warm-up request: http {resp.status_code}: {resp.text[:300]}")
            got = resp.json().get("usage", {}).get("completion_tokens")
            if got != max_tokens:
                raise RuntimeError(f"warm-up request: {got} completion tokens, asked for {max_tokens} "
                                   "(is eos disabled in the checkpoint's generation_config.json?)")

        try:
            one(0)
            if requests > 1:
                with ThreadPoolExecutor(requests - 1) as pool:
                    list(pool.map(one, range(1, requests)))
        except httpx.HTTPError as e:
            raise RuntimeError(f"warm-up request: {type(e).__name__}: {e}") from None
        return time.monotonic() - start

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (uvicorn shuts down), then SIGKILL to the whole session if it hangs."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                self.proc.wait()
        if not self._out.closed:
            self._out.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        """The log's last ``lines`` lines, progress-bar redraws dropped."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        kept = [line.rsplit("\r", 1)[-1] for line in text.splitlines() if line.strip()]
        return "\n".join(kept[-lines:])


def _run(cmd: Sequence[str], timeout: float) -> int:
    proc = subprocess.Popen(list(cmd), start_new_session=True)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"hf_serve_peer: the command ran past {timeout:.0f} s; killed", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return TIMED_OUT


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(prog="python -m runtime.bench.hf_serve_peer",
                                description=__doc__.split("\n\n")[0],
                                epilog="everything after -- is the command to run while the peer is up")
    p.add_argument("checkpoint", help="the model folder to serve (the model name requests must send)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8012)
    p.add_argument("--no-continuous-batching", action="store_true", help="serve one request at a time")
    p.add_argument("--serve-flags", default="", help="more `transformers serve` flags, one string "
                                                      "(e.g. '--cb-num-blocks 128 --cb-max-batch-tokens 512')")
    p.add_argument("--log", default="out/hf_serve/server.log", help="the peer's output (default: %(default)s)")
    p.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for /health")
    p.add_argument("--warmup", type=int, default=4, help="warm-up requests, 0 for none (default: %(default)s)")
    p.add_argument("--warmup-timeout", type=float, default=120.0)
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds the command may take")
    p.add_argument("--tail", type=int, default=15, help="log lines printed at the end (default: %(default)s)")
    args = p.parse_args(argv)
    if not Path(args.checkpoint, "config.json").is_file():
        p.error(f"{args.checkpoint}: no config.json (write one with python -m runtime.bench.hf_checkpoint)")
    cmd = serve_command(args.checkpoint, host=args.host, port=args.port, device=args.device, dtype=args.dtype,
                        continuous_batching=not args.no_continuous_batching, extra=shlex.split(args.serve_flags))
    print(f"hf_serve_peer: starting {shlex.join(cmd)} (log: {args.log})", file=sys.stderr, flush=True)
    peer = PeerProcess(cmd, f"http://{args.host}:{args.port}", args.log)
    status, tail = 0, args.tail
    try:
        try:
            waited = peer.wait_ready(args.ready_timeout)
        except RuntimeError as e:
            print(f"hf_serve_peer: {e}", file=sys.stderr)
            status, tail = NOT_READY, max(tail, 40)
            return status
        print(f"hf_serve_peer: ready after {waited:.1f} s", file=sys.stderr, flush=True)
        if args.warmup > 0:
            try:
                took = peer.warm_up(args.checkpoint, args.warmup, timeout=args.warmup_timeout)
            except RuntimeError as e:
                print(f"hf_serve_peer: {e}", file=sys.stderr)
                status, tail = WARMUP_FAILED, max(tail, 40)
                return status
            print(f"hf_serve_peer: warmed up ({args.warmup} requests) in {took:.1f} s", file=sys.stderr, flush=True)
        if command:
            status = _run(command, args.run_timeout)
            if peer.proc.poll() is not None:
                print(f"hf_serve_peer: the peer exited with status {peer.proc.returncode} during the run",
                      file=sys.stderr)
                status, tail = status or 1, max(tail, 40)
        return status
    finally:
        code = peer.stop()
        print(f"hf_serve_peer: peer stopped (exit status {code}); the end of {args.log}:", file=sys.stderr)
        print(peer.log_tail(tail), file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
