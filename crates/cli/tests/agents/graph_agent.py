# The e2e test's agent: a LangGraph graph (a fake chat model from
# langchain_core) served on the agent contract, checkpointed in Tessera, that
# calls a side-effecting tool (charge) and a read-only tool (lookup) through
# the gateway with one idempotency key per logical call.
import operator
from typing import Annotated, TypedDict

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langgraph.graph import END, StateGraph

from tessera_client import Client
from tessera_client.agent import serve
from tessera_client.langgraph import TesseraSaver


def merge(a: dict, b: dict) -> dict:
    out = dict(a or {})
    out.update(b or {})
    return out


class State(TypedDict):
    turn: int
    use_tools: bool
    thoughts: Annotated[list, operator.add]
    charges: Annotated[dict, merge]


client = Client()
model = FakeListChatModel(responses=["charge the card", "look it up"])


def think(s: State) -> dict:
    msg = model.invoke(f"turn {s['turn']}")
    return {"thoughts": [msg.content]}


def act(s: State) -> dict:
    sid = client.session_id
    turn = s["turn"]
    if not s.get("use_tools"):
        return {"charges": {str(turn): "no-tools"}}
    key = f"{sid}-turn{turn}"
    r = client.call_tool("charge", {"call": key, "amount": turn + 1}, tool_call_id=key, idempotency_key=key)
    if r.get("status") != "completed":
        raise RuntimeError(f"charge {key}: {r}")
    client.call_tool("lookup", {"call": key}, tool_call_id=f"{key}-lookup")
    return {"charges": {str(turn): r["result"].get("charge_id", "?")}}


b = StateGraph(State)
b.add_node("think", think)
b.add_node("act", act)
b.set_entry_point("think")
b.add_edge("think", "act")
b.add_edge("act", END)
graph = b.compile(checkpointer=TesseraSaver(client))


def handle(payload, ctx):
    cfg = {"configurable": {"thread_id": ctx.session_id}}
    out = graph.invoke({"turn": payload["turn"], "use_tools": payload.get("use_tools", True),
                        "thoughts": [], "charges": {}}, cfg)
    return {"charges": out["charges"], "turns_done": len(out["charges"])}, {"tokens_in": 7, "tokens_out": 3}


serve(handle)
