"""The LangGraph saver against a live server: TESSERA_URL and TESSERA_API_KEY
must point at one (the Rust e2e test runs this file). Skipped otherwise."""

import os
import uuid

import pytest

pytestmark = pytest.mark.skipif(not os.environ.get("TESSERA_API_KEY"), reason="no server: set TESSERA_URL and TESSERA_API_KEY")


def test_graph_resumes_from_tessera_checkpoints():
    from typing import TypedDict

    from langgraph.graph import END, StateGraph

    from tessera_client import Client
    from tessera_client.langgraph import TesseraSaver

    class S(TypedDict):
        n: int

    def step(s: S) -> S:
        return {"n": s["n"] + 1}

    b = StateGraph(S)
    b.add_node("a", step)
    b.add_node("b", step)
    b.set_entry_point("a")
    b.add_edge("a", "b")
    b.add_edge("b", END)
    saver = TesseraSaver(Client())
    g = b.compile(checkpointer=saver)
    tid = "py-" + uuid.uuid4().hex[:8]
    cfg = {"configurable": {"thread_id": tid}}
    assert g.invoke({"n": 0}, cfg)["n"] == 2
    # A new saver (a new process, another sandbox) sees the same state.
    g2 = b.compile(checkpointer=TesseraSaver(Client()))
    assert g2.get_state(cfg).values["n"] == 2
    hist = list(g2.get_state_history(cfg))
    assert len(hist) >= 3
    assert hist[0].config["configurable"]["checkpoint_id"] != hist[-1].config["configurable"]["checkpoint_id"]
