"""A LangGraph checkpoint saver backed by Tessera sessions.

The graph's ``thread_id`` is the Tessera session id: checkpoints, their
parents and pending writes live in the control plane's store, so a graph
resumes where it stopped on another sandbox after a crash.

    from tessera_client import Client
    from tessera_client.langgraph import TesseraSaver

    graph = builder.compile(checkpointer=TesseraSaver(Client()))
    graph.invoke(inputs, {"configurable": {"thread_id": session_id}})
"""

from __future__ import annotations

import asyncio
import base64
import random
from typing import Any, AsyncIterator, Iterator, Optional, Sequence

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)

from . import Client


def _enc_ns(ns: str) -> str:
    # LangGraph namespaces hold ':' and '|'; Tessera names do not.
    return base64.urlsafe_b64encode(ns.encode()).decode().rstrip("=") if ns else ""


class TesseraSaver(BaseCheckpointSaver):
    """Checkpoints in Tessera (``thread_id`` = session id)."""

    def __init__(self, client: Optional[Client] = None, **kw: Any):
        super().__init__(**kw)
        self.client = client or Client()

    # ---- encoding ----

    def _dump(self, v: Any) -> dict:
        t, data = self.serde.dumps_typed(v)
        return {"type": t, "data": base64.b64encode(data).decode()}

    def _load(self, d: dict) -> Any:
        return self.serde.loads_typed((d["type"], base64.b64decode(d["data"])))

    def _tuple(self, thread_id: str, ns: str, cp: dict) -> CheckpointTuple:
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cp["id"]}}
        parent = None
        if cp.get("parent_id"):
            parent = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cp["parent_id"]}}
        writes = [
            (w["task_id"], w["channel"], self._load(w["value"]))
            for w in sorted(cp.get("pending_writes") or [], key=lambda w: (w["task_id"], w.get("idx", 0)))
        ]
        return CheckpointTuple(
            config=config,
            checkpoint=self._load(cp["checkpoint"]),
            metadata=self._load(cp["metadata"]) if cp.get("metadata") else {},
            parent_config=parent,
            pending_writes=writes,
        )

    # ---- the saver API ----

    def get_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        c = config["configurable"]
        thread_id, ns = c["thread_id"], c.get("checkpoint_ns", "")
        cid = get_checkpoint_id(config) or "latest"
        cp = self.client.checkpoint_get(cid, ns=_enc_ns(ns), session_id=thread_id)
        if cp is None:
            return None
        return self._tuple(thread_id, ns, cp)

    def list(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        if config is None:
            return
        c = config["configurable"]
        thread_id, ns = c["thread_id"], c.get("checkpoint_ns", "")
        before_seq = None
        if before is not None:
            b = self.client.checkpoint_get(get_checkpoint_id(before), ns=_enc_ns(ns), session_id=thread_id)
            before_seq = b["seq"] if b else None
        items = self.client.checkpoints(ns=_enc_ns(ns), before=before_seq, limit=limit or 1000, session_id=thread_id)
        n = 0
        for cp in items:
            full = self.client.checkpoint_get(cp["id"], ns=_enc_ns(ns), session_id=thread_id)
            if full is None:
                continue
            t = self._tuple(thread_id, ns, full)
            if filter and not all(t.metadata.get(k) == v for k, v in filter.items()):
                continue
            yield t
            n += 1
            if limit and n >= limit:
                return

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        c = config["configurable"]
        thread_id, ns = c["thread_id"], c.get("checkpoint_ns", "")
        self.client.checkpoint_put(
            checkpoint["id"],
            self._dump(checkpoint),
            metadata=self._dump(dict(metadata)),
            parent_id=c.get("checkpoint_id"),
            ns=_enc_ns(ns),
            session_id=thread_id,
        )
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        c = config["configurable"]
        thread_id, ns = c["thread_id"], c.get("checkpoint_ns", "")
        out = []
        for i, (channel, value) in enumerate(writes):
            out.append(
                {
                    "task_id": task_id,
                    "idx": WRITES_IDX_MAP.get(channel, i),
                    "channel": channel,
                    "value": self._dump(value),
                }
            )
        self.client.checkpoint_put_writes(c["checkpoint_id"], out, ns=_enc_ns(ns), session_id=thread_id)

    def get_next_version(self, current: Optional[str], channel: Any = None) -> str:
        if current is None:
            v = 0
        elif isinstance(current, int):
            v = current
        else:
            v = int(str(current).split(".")[0])
        return f"{v + 1:032}.{random.random():016}"

    # ---- async: the same calls in a worker thread ----

    async def aget_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: Optional[RunnableConfig], **kw: Any) -> AsyncIterator[CheckpointTuple]:
        for t in await asyncio.to_thread(lambda: list(self.list(config, **kw))):
            yield t

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)
