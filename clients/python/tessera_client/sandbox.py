"""Sandboxes from a program, shaped like E2B's Python SDK.

    from tessera_client.sandbox import Sandbox

    sbx = Sandbox.create(timeout=300)                 # E2B: Sandbox.create()
    r = sbx.commands.run("echo hi")                   # .stdout, .stderr, .exit_code
    sbx.commands.run("make", on_stdout=print)         # streamed as it comes
    sbx.files.write("/workspace/a.txt", "data")
    sbx.files.read("/workspace/a.txt")                # "data"
    sbx.files.list("/workspace")                      # [EntryInfo(name, type, path)]
    sbx.set_timeout(60)
    sbx.pause()                                       # E2B: beta_pause(); to disk
    sbx = Sandbox.connect(sbx.sandbox_id)             # resumes a paused one
    sbx.kill()

Against ``/v1/sandboxes`` of a Tessera server (``tessera up --sandboxes``):
``url`` and ``api_key`` default to ``TESSERA_URL`` and ``TESSERA_API_KEY``. As
in E2B, a command that exits non-zero raises ``CommandExitException`` (its
result is on the exception); pass ``check=False`` to get the result instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union
from urllib.parse import quote

import httpx

from . import Client, TesseraError, _reply

__all__ = [
    "Sandbox",
    "CommandResult",
    "CommandExitException",
    "EntryInfo",
    "SandboxInfo",
]


@dataclass
class CommandResult:
    """What a command did (E2B's ``CommandResult``, plus Tessera's fields)."""

    stdout: str
    stderr: str
    exit_code: Optional[int]
    error: Optional[str] = None
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    alerts: list = field(default_factory=list)

    @classmethod
    def _of(cls, d: dict) -> "CommandResult":
        code = d.get("exit_code")
        err = None
        if d.get("timed_out"):
            err = "the command timed out"
        elif d.get("oom_killed"):
            err = "the command ran out of memory"
        elif d.get("signal") is not None:
            err = f"killed by signal {d['signal']}"
        return cls(
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            exit_code=code,
            error=err,
            signal=d.get("signal"),
            timed_out=bool(d.get("timed_out")),
            oom_killed=bool(d.get("oom_killed")),
            alerts=list(d.get("alerts") or []),
        )


class CommandExitException(Exception):
    """A command exited non-zero (or was killed); ``result`` has what it said."""

    def __init__(self, result: CommandResult):
        self.result = result
        self.stdout, self.stderr = result.stdout, result.stderr
        self.exit_code, self.error = result.exit_code, result.error
        why = result.error or f"exit code {result.exit_code}"
        super().__init__(f"command failed ({why}): {result.stderr.strip()[-500:]}")


@dataclass
class EntryInfo:
    name: str
    type: str
    path: str
    size: Optional[int] = None


@dataclass
class SandboxInfo:
    sandbox_id: str
    template: str
    state: str
    runtime_class: str
    metadata: dict
    started_at: float
    end_at: Optional[float]

    @classmethod
    def _of(cls, d: dict) -> "SandboxInfo":
        return cls(
            sandbox_id=d["sandbox_id"],
            template=d.get("template", ""),
            state=d.get("state", ""),
            runtime_class=d.get("runtime_class", ""),
            metadata=dict(d.get("metadata") or {}),
            started_at=d.get("started_at", 0.0),
            end_at=d.get("end_at"),
        )


def _http(url: Optional[str], api_key: Optional[str], timeout: float) -> httpx.Client:
    """The connection ``Client`` makes (``TESSERA_URL``/``TESSERA_API_KEY``, a
    ``unix://`` socket inside a sandbox, retries)."""
    return Client(url=url, api_key=api_key, timeout=timeout)._http


class Commands:
    """``sbx.commands``."""

    def __init__(self, sbx: "Sandbox"):
        self._sbx = sbx

    def run(
        self,
        cmd: str,
        envs: Optional[dict] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = 60,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        stdin: Optional[str] = None,
        check: bool = True,
    ) -> CommandResult:
        """Runs ``cmd`` with the shell in the sandbox; with ``on_stdout`` or
        ``on_stderr`` its output is streamed to them as it comes."""
        body: dict = {"cmd": cmd}
        for k, v in (("envs", envs), ("cwd", cwd), ("timeout", timeout), ("stdin", stdin)):
            if v is not None:
                body[k] = v
        path = f"/v1/sandboxes/{quote(self._sbx.sandbox_id, safe='')}/commands"
        http = self._sbx._http
        # The HTTP call lasts as long as the command, and a little more.
        wait = None if timeout is None else float(timeout) + 30
        if on_stdout is None and on_stderr is None:
            res = CommandResult._of(_reply(http.post(path, json=body, timeout=wait)))
        else:
            body["stream"] = True
            res = None
            with http.stream("POST", path, json=body, timeout=wait) as r:
                if r.status_code >= 400:
                    r.read()
                    _reply(r)
                event = None
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data = json.loads(line[5:].strip())
                        if event == "stdout" and on_stdout:
                            on_stdout(data["data"])
                        elif event == "stderr" and on_stderr:
                            on_stderr(data["data"])
                        elif event == "end":
                            res = CommandResult._of(data)
                        elif event == "error":
                            raise TesseraError(data.get("status", 500), data)
            if res is None:
                raise TesseraError(502, "the command's stream ended without its result")
        if check and (res.exit_code != 0 or res.error):
            raise CommandExitException(res)
        return res


class Files:
    """``sbx.files``."""

    def __init__(self, sbx: "Sandbox"):
        self._sbx = sbx

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{quote(self._sbx.sandbox_id, safe='')}/files{suffix}"

    def read(self, path: str, format: str = "text") -> Union[str, bytes]:
        """The file's content: ``str`` (UTF-8), or ``bytes`` with ``format="bytes"``."""
        r = self._sbx._http.get(self._path(), params={"path": path})
        if r.status_code >= 400:
            _reply(r)
        return r.content if format == "bytes" else r.content.decode("utf-8")

    def write(self, path: str, data: Union[str, bytes]) -> EntryInfo:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        _reply(self._sbx._http.put(self._path(), params={"path": path}, content=raw))
        return EntryInfo(name=path.rstrip("/").rsplit("/", 1)[-1], type="file", path=path, size=len(raw))

    def list(self, path: str) -> list:
        d = _reply(self._sbx._http.get(self._path("/list"), params={"path": path}))
        items = d.get("entries", d.get("items", [])) if isinstance(d, dict) else d
        return [
            EntryInfo(
                name=e["name"],
                type=e.get("type", ""),
                path=e.get("path", path.rstrip("/") + "/" + e["name"]),
                size=e.get("size"),
            )
            for e in items
        ]

    def remove(self, path: str, recursive: bool = False) -> None:
        params = {"path": path}
        if recursive:
            params["recursive"] = "true"
        _reply(self._sbx._http.delete(self._path(), params=params))

    def exists(self, path: str) -> bool:
        """Whether ``path`` is there (a file or a folder)."""
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            return any(e.name == name for e in self.list(parent or "/"))
        except TesseraError as e:
            if e.status == 404:
                return False
            raise


class Sandbox:
    """One sandbox on a Tessera server."""

    def __init__(self, info: dict, http: httpx.Client):
        self._http = http
        self._info = info
        self.sandbox_id: str = info["sandbox_id"]
        self.commands = Commands(self)
        self.files = Files(self)

    # ---- making and finding ----

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        timeout: Optional[int] = None,
        metadata: Optional[dict] = None,
        envs: Optional[dict] = None,
        auto_pause: bool = False,
        runtime_class: Optional[str] = None,
        memory_mb: Optional[int] = None,
        cpus: Optional[float] = None,
        allow_domains: Optional[list] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: float = 120.0,
    ) -> "Sandbox":
        """A new sandbox (``template`` defaults to ``base``, ``timeout`` to 300 s).
        With ``auto_pause`` its timeout pauses it to disk instead of killing it."""
        http = _http(url, api_key, request_timeout)
        body: dict = {}
        for k, v in (
            ("template", template),
            ("timeout", timeout),
            ("metadata", metadata),
            ("env_vars", envs),
            ("runtime_class", runtime_class),
            ("memory_mb", memory_mb),
            ("cpus", cpus),
            ("allow_domains", allow_domains),
        ):
            if v is not None:
                body[k] = v
        if auto_pause:
            body["auto_pause"] = True
        try:
            info = _reply(http.post("/v1/sandboxes", json=body))
        except Exception:
            http.close()
            raise
        return cls(info, http)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: float = 120.0,
    ) -> "Sandbox":
        """The sandbox ``sandbox_id``, resumed first if it is paused (as E2B's
        ``connect``)."""
        http = _http(url, api_key, request_timeout)
        try:
            info = _reply(http.get(f"/v1/sandboxes/{quote(sandbox_id, safe='')}"))
            if info.get("state") in ("paused", "pausing"):
                info = _reply(http.post(f"/v1/sandboxes/{quote(sandbox_id, safe='')}/resume"))
        except Exception:
            http.close()
            raise
        return cls(info, http)

    @staticmethod
    def list(url: Optional[str] = None, api_key: Optional[str] = None) -> list:
        """The caller's sandboxes, as ``SandboxInfo``."""
        with _http(url, api_key, 30.0) as http:
            return [SandboxInfo._of(d) for d in _reply(http.get("/v1/sandboxes"))["items"]]

    # ---- this sandbox ----

    def _post(self, what: str, body: Any = None) -> dict:
        path = f"/v1/sandboxes/{quote(self.sandbox_id, safe='')}/{what}"
        self._info = _reply(self._http.post(path, json=body) if body is not None else self._http.post(path))
        return self._info

    def get_info(self) -> SandboxInfo:
        self._info = _reply(self._http.get(f"/v1/sandboxes/{quote(self.sandbox_id, safe='')}"))
        return SandboxInfo._of(self._info)

    def is_running(self) -> bool:
        try:
            return self.get_info().state == "running"
        except TesseraError as e:
            if e.status == 404:
                return False
            raise

    def set_timeout(self, timeout: int) -> None:
        """Kill (or, with ``auto_pause``, pause) the sandbox ``timeout`` seconds from now."""
        self._post("timeout", {"timeout": int(timeout)})

    def pause(self) -> str:
        """Pauses the sandbox to disk (its memory and processes freed); returns its id,
        for ``Sandbox.connect``."""
        self._post("pause")
        return self.sandbox_id

    beta_pause = pause

    def resume(self) -> None:
        self._post("resume")

    def kill(self) -> bool:
        """Kills the sandbox and everything in it; ``False`` if it was gone already."""
        r = self._http.delete(f"/v1/sandboxes/{quote(self.sandbox_id, safe='')}")
        if r.status_code == 404:
            return False
        _reply(r)
        return True

    def close(self) -> None:
        """Closes this handle's connection (the sandbox keeps running)."""
        self._http.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        finally:
            self.close()
