# The official `openai` Python package against Tessera's gateway (started by
# `tessera up`, a pool of test engines behind it). Reads OPENAI_BASE_URL and
# OPENAI_API_KEY like any OpenAI program; TESSERA_MODEL names the pool's model.
# Prints one JSON line with what it saw; exits non-zero on any mismatch.
import json
import os
import sys

import openai
from openai import OpenAI

model = os.environ["TESSERA_MODEL"]
client = OpenAI(
    default_headers={"X-Session-Id": os.environ.get("TESSERA_SESSION", "py-openai")},
    max_retries=0,
)
seen = {"openai_version": openai.__version__}


def check(cond, what):
    if not cond:
        print(json.dumps({"failed": what, "seen": seen}, default=str))
        sys.exit(1)


# Models list.
models = [m.id for m in client.models.list()]
seen["models"] = models
check(model in models, f"model {model} in GET /v1/models")

messages = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say ok."},
]

# Chat, plain.
r = client.chat.completions.create(model=model, messages=messages)
seen["chat"] = r.choices[0].message.content
check(r.object == "chat.completion", "chat object")
check(bool(r.choices[0].message.content), "chat content")
check(r.usage is not None and r.usage.completion_tokens > 0, "chat usage")

# Chat, streaming, with usage in the last chunk.
text, usage, chunks = "", None, 0
for c in client.chat.completions.create(
    model=model, messages=messages, stream=True, stream_options={"include_usage": True}
):
    chunks += 1
    if c.choices and c.choices[0].delta.content:
        text += c.choices[0].delta.content
    if c.usage is not None:
        usage = c.usage
seen["chat_stream"] = {"text": text, "chunks": chunks, "usage": usage and usage.completion_tokens}
check(text.strip() != "", "chat stream text")
check(usage is not None and usage.completion_tokens > 0, "chat stream usage chunk")

# Chat, streaming, no usage asked: no usage chunk reaches the client.
extra = 0
for c in client.chat.completions.create(model=model, messages=messages, stream=True):
    if c.usage is not None:
        extra += 1
check(extra == 0, "no usage chunk unless asked")

# Completions, plain.
r = client.completions.create(model=model, prompt="Say ok.")
seen["completion"] = r.choices[0].text
check(r.object == "text_completion", "completion object")
check(bool(r.choices[0].text), "completion text")

# Completions, streaming.
text = ""
for c in client.completions.create(model=model, prompt="Say ok.", stream=True):
    if c.choices:
        text += c.choices[0].text
seen["completion_stream"] = text
check(text.strip() != "", "completion stream text")

# Errors in OpenAI's shape: an unknown model is a NotFoundError.
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    check(False, "unknown model refused")
except openai.NotFoundError as e:
    seen["not_found"] = e.status_code

# models.retrieve, and its 404 in OpenAI's shape.
m = client.models.retrieve(model)
check(m.id == model, "models.retrieve")
try:
    client.models.retrieve("no-such-model")
    check(False, "an unknown model retrieved")
except openai.NotFoundError as e:
    seen["retrieve_not_found"] = str(e)
    check("no-such-model" in str(e), "the 404 names the model")

# A wrong key: an AuthenticationError whose message the client can show (OpenAI's
# error shape, not a bare "Error code: 401").
bad = OpenAI(api_key="tsk_000000000000_" + "0" * 64, max_retries=0)
try:
    bad.models.list()
    check(False, "a wrong key accepted")
except openai.AuthenticationError as e:
    seen["unauthorized"] = str(e)
    check(e.body is not None and e.body.get("message"), "401 in OpenAI's shape")
    check(e.code is not None, "401 carries a code")

# Embeddings for a model no pool serves: OpenAI's 404.
try:
    client.embeddings.create(model="no-such-model", input="hi")
    check(False, "embeddings of an unknown model")
except openai.NotFoundError as e:
    seen["embeddings_not_found"] = e.status_code

print(json.dumps({"ok": True, "seen": seen}))
