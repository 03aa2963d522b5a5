"""Python client for Tessera's agent platform.

``Client`` talks to the control plane: invoke runtimes in sessions, call tools
through the gateway (exactly once per idempotency key), read and write a
session's memory, history and checkpoints, publish and read events, record
usage. Inside a Tessera sandbox ``Client()`` needs no arguments: it reads
``TESSERA_URL`` (a ``unix://`` socket there), ``TESSERA_API_KEY`` and
``TESSERA_SESSION_ID``.

``tessera_client.langgraph.TesseraSaver`` is a LangGraph checkpoint saver
backed by Tessera sessions; ``tessera_client.agent.serve`` runs the agent
contract (``POST /invocations``, ``GET /ping``).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Iterator, Optional
from urllib.parse import quote

import httpx

__all__ = ["Client", "TesseraError"]
__version__ = "0.1.0"


class TesseraError(Exception):
    """An error reply: ``status``, ``code`` (stable), ``detail`` and ``field``."""

    def __init__(self, status: int, body: Any):
        self.status = status
        self.body = body
        if isinstance(body, dict):
            self.code = body.get("code", "")
            self.detail = body.get("detail", "")
            self.field = body.get("field")
        else:
            self.code, self.detail, self.field = "", str(body), None
        super().__init__(f"{status} {self.code}: {self.detail}")


def _reply(r: httpx.Response) -> Any:
    """The reply's JSON (or text); a ``TesseraError`` for an error status."""
    try:
        data = r.json()
    except ValueError:
        data = r.text
    if r.status_code >= 400:
        raise TesseraError(r.status_code, data)
    return data


def _q(s: str) -> str:
    return quote(s, safe="")


class Client:
    """A Tessera API client (synchronous, thread-safe)."""

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        session_id: Optional[str] = None,
        timeout: float = 300.0,
    ):
        url = url or os.environ.get("TESSERA_URL", "http://127.0.0.1:7700")
        self.api_key = api_key or os.environ.get("TESSERA_API_KEY", "")
        self.session_id = session_id or os.environ.get("TESSERA_SESSION_ID")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if url.startswith("unix://"):
            transport = httpx.HTTPTransport(uds=url[len("unix://"):], retries=3)
            self._http = httpx.Client(base_url="http://tessera", transport=transport, headers=headers, timeout=timeout)
        else:
            transport = httpx.HTTPTransport(retries=3)
            self._http = httpx.Client(base_url=url.rstrip("/"), transport=transport, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- plumbing ----

    def request(self, method: str, path: str, body: Any = None, params: Optional[dict] = None) -> Any:
        return _reply(self._http.request(method, path, json=body, params=params))

    def _sid(self, session_id: Optional[str]) -> str:
        sid = session_id or self.session_id
        if not sid:
            raise ValueError("no session id: pass session_id= or set TESSERA_SESSION_ID")
        return sid

    # ---- runtimes and invocations ----

    def create_runtime(self, name: str, **spec: Any) -> dict:
        return self.request("POST", "/v1/runtimes", {"name": name, **spec})

    def update_runtime(self, name: str, **spec: Any) -> dict:
        return self.request("PUT", f"/v1/runtimes/{_q(name)}", spec)

    def invoke(
        self,
        runtime: str,
        payload: Any,
        session_id: Optional[str] = None,
        endpoint: Optional[str] = None,
    ) -> tuple[str, Any]:
        """Invokes ``runtime`` in a session (created or resumed); returns
        ``(session_id, reply)``."""
        params = {}
        if session_id:
            params["session_id"] = session_id
        if endpoint:
            params["endpoint"] = endpoint
        r = self._http.post(f"/v1/runtimes/{_q(runtime)}/invocations", json=payload, params=params)
        try:
            data = r.json()
        except ValueError:
            data = r.text
        if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/problem+json"):
            raise TesseraError(r.status_code, data)
        return r.headers.get("x-tessera-session-id", session_id or ""), data

    # ---- sessions ----

    def session(self, session_id: Optional[str] = None) -> dict:
        return self.request("GET", f"/v1/sessions/{_q(self._sid(session_id))}")

    def sessions(self, state: Optional[str] = None, runtime: Optional[str] = None) -> list:
        params = {k: v for k, v in {"state": state, "runtime": runtime}.items() if v}
        return self.request("GET", "/v1/sessions", params=params)["items"]

    def kill(self, session_id: str, reason: Optional[str] = None) -> dict:
        return self.request("POST", f"/v1/sessions/{_q(session_id)}/kill", {"reason": reason} if reason else None)

    def trace(self, session_id: Optional[str] = None) -> dict:
        return self.request("GET", f"/v1/sessions/{_q(self._sid(session_id))}/trace")

    # ---- memory and history ----

    def memory_get(self, key: str, default: Any = None, session_id: Optional[str] = None) -> Any:
        try:
            return self.request("GET", f"/v1/sessions/{_q(self._sid(session_id))}/memory/{_q(key)}")["value"]
        except TesseraError as e:
            if e.status == 404:
                return default
            raise

    def memory_put(self, key: str, value: Any, session_id: Optional[str] = None) -> None:
        self.request("PUT", f"/v1/sessions/{_q(self._sid(session_id))}/memory/{_q(key)}", {"value": value})

    def memory_delete(self, key: str, session_id: Optional[str] = None) -> None:
        self.request("DELETE", f"/v1/sessions/{_q(self._sid(session_id))}/memory/{_q(key)}")

    def memory_keys(self, session_id: Optional[str] = None) -> list:
        return self.request("GET", f"/v1/sessions/{_q(self._sid(session_id))}/memory")["keys"]

    def history_append(self, entry: Any, session_id: Optional[str] = None) -> int:
        return self.request("POST", f"/v1/sessions/{_q(self._sid(session_id))}/history", entry)["seq"]

    def history(self, after: int = 0, limit: int = 100, session_id: Optional[str] = None) -> list:
        return self.request(
            "GET", f"/v1/sessions/{_q(self._sid(session_id))}/history", params={"after": after, "limit": limit}
        )["items"]

    # ---- checkpoints ----

    def checkpoint_put(
        self,
        checkpoint_id: str,
        checkpoint: Any,
        metadata: Any = None,
        parent_id: Optional[str] = None,
        ns: str = "",
        session_id: Optional[str] = None,
    ) -> dict:
        body = {"ns": ns, "checkpoint": checkpoint, "metadata": metadata or {}}
        if parent_id:
            body["parent_id"] = parent_id
        return self.request("PUT", f"/v1/sessions/{_q(self._sid(session_id))}/checkpoints/{_q(checkpoint_id)}", body)

    def checkpoint_get(self, checkpoint_id: str = "latest", ns: str = "", session_id: Optional[str] = None) -> Optional[dict]:
        try:
            return self.request(
                "GET", f"/v1/sessions/{_q(self._sid(session_id))}/checkpoints/{_q(checkpoint_id)}", params={"ns": ns}
            )
        except TesseraError as e:
            if e.status == 404:
                return None
            raise

    def checkpoints(
        self, ns: str = "", before: Optional[int] = None, limit: int = 20, session_id: Optional[str] = None
    ) -> list:
        params: dict = {"ns": ns, "limit": limit}
        if before is not None:
            params["before"] = before
        return self.request("GET", f"/v1/sessions/{_q(self._sid(session_id))}/checkpoints", params=params)["items"]

    def checkpoint_put_writes(self, checkpoint_id: str, writes: list, ns: str = "", session_id: Optional[str] = None) -> None:
        self.request(
            "POST",
            f"/v1/sessions/{_q(self._sid(session_id))}/checkpoints/{_q(checkpoint_id)}/writes",
            {"ns": ns, "writes": writes},
        )

    # ---- tools ----

    def call_tool(
        self,
        name: str,
        arguments: dict,
        tool_call_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        session_id: Optional[str] = None,
    ) -> dict:
        """Calls a tool through the gateway. The same ``tool_call_id`` /
        ``idempotency_key`` returns the recorded result instead of calling
        again, so retrying after a crash is safe."""
        body = {
            "session_id": self._sid(session_id),
            "tool_call_id": tool_call_id or str(uuid.uuid4()),
            "arguments": arguments,
        }
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        return self.request("POST", f"/v1/tools/{_q(name)}/call", body)

    # ---- events and usage ----

    def publish(self, topic: str, payload: Any) -> int:
        return self.request("POST", f"/v1/topics/{_q(topic)}/events", payload)["offset"]

    def events(self, topic: str, after: int = 0, limit: int = 100, wait_ms: int = 0) -> list:
        return self.request(
            "GET", f"/v1/topics/{_q(topic)}/events", params={"after": after, "limit": limit, "wait_ms": wait_ms}
        )["items"]

    def subscribe(self, topic: str, after: int = 0) -> Iterator[dict]:
        """Follows a topic (long polls); yields events in order."""
        while True:
            for e in self.events(topic, after=after, wait_ms=15000):
                after = e["offset"]
                yield e

    def commit_offset(self, topic: str, consumer: str, offset: int) -> int:
        return self.request("PUT", f"/v1/topics/{_q(topic)}/offsets/{_q(consumer)}", {"offset": offset})["offset"]

    def record_usage(
        self, kind: str, quantity: float, source_id: str, runtime: Optional[str] = None, session_id: Optional[str] = None
    ) -> dict:
        return self.request(
            "POST",
            "/v1/usage",
            {
                "session": self._sid(session_id),
                "runtime": runtime or os.environ.get("TESSERA_RUNTIME", "unknown"),
                "kind": kind,
                "quantity": quantity,
                "source_id": source_id,
            },
        )

    def usage(self, session_id: Optional[str] = None, runtime: Optional[str] = None, records: bool = False) -> dict:
        params: dict = {}
        if session_id:
            params["session"] = session_id
        if runtime:
            params["runtime"] = runtime
        if records:
            params["records"] = "true"
        return self.request("GET", "/v1/usage", params=params)


def _dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"))
