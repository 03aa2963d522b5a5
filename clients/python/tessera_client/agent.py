"""The agent contract inside a Tessera sandbox (the one AgentCore users know):
``POST /invocations`` with the payload, ``GET /ping`` answering ``Healthy``
or, while an invocation runs, ``HealthyBusy``. Tessera reaches the agent on
the unix socket ``$TESSERA_AGENT_SOCKET``.

    from tessera_client.agent import serve

    def handle(payload, ctx):
        return {"answer": payload["question"].upper()}

    serve(handle)

``ctx`` has ``session_id``, ``runtime`` and ``client`` (a ``tessera_client.Client``
for tools, memory and checkpoints). Return a dict (sent as JSON); to report
model usage, return ``(reply, {"tokens_in": 12, "tokens_out": 40})``.
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import threading
from types import SimpleNamespace
from typing import Any, Callable

_busy = 0
_lock = threading.Lock()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(handler: Callable[[Any, Any], Any], socket_path: str | None = None) -> None:
    from . import Client

    path = socket_path or os.environ.get("TESSERA_AGENT_SOCKET", "/tmp/tessera-agent.sock")
    ctx = SimpleNamespace(
        session_id=os.environ.get("TESSERA_SESSION_ID"),
        runtime=os.environ.get("TESSERA_RUNTIME"),
        client=Client() if os.environ.get("TESSERA_URL") else None,
    )

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _reply(self, code: int, body: bytes, headers: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/ping":
                status = "HealthyBusy" if _busy else "Healthy"
                self._reply(200, json.dumps({"status": status}).encode(), {"Content-Type": "application/json"})
            else:
                self._reply(404, b"not found")

        def do_POST(self) -> None:
            global _busy
            if self.path != "/invocations":
                self._reply(404, b"not found")
                return
            n = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(n)
            with _lock:
                _busy += 1
            try:
                payload = json.loads(raw) if raw else None
                out = handler(payload, ctx)
                usage = None
                if isinstance(out, tuple):
                    out, usage = out
                headers = {"Content-Type": "application/json"}
                if usage:
                    headers["X-Tessera-Usage"] = json.dumps(usage)
                self._reply(200, json.dumps(out).encode(), headers)
            except Exception as e:  # the agent's own failure: 500 with the reason
                self._reply(500, json.dumps({"error": repr(e)}).encode(), {"Content-Type": "application/json"})
            finally:
                with _lock:
                    _busy -= 1

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    _Server(path, H).serve_forever()
