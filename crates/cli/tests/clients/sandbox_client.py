"""The E2B flow through tessera_client.sandbox against a real `tessera up
--sandboxes` (TESSERA_URL, TESSERA_API_KEY). Prints OK at the end; any failure
raises with what went wrong."""

from tessera_client import TesseraError
from tessera_client.sandbox import CommandExitException, Sandbox

sbx = Sandbox.create(timeout=120, metadata={"who": "e2b-flow"}, envs={"GREETING": "hi"})
assert sbx.get_info().state == "running", sbx.get_info()

r = sbx.commands.run("echo $GREETING; echo oops >&2")
assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "oops\n", 0), r

out, err = [], []
r = sbx.commands.run(
    "for i in 1 2 3; do echo line$i; sleep 0.1; done; echo e >&2",
    on_stdout=out.append,
    on_stderr=err.append,
)
assert "".join(out) == "line1\nline2\nline3\n" and "".join(err) == "e\n", (out, err)
assert r.exit_code == 0, r

try:
    sbx.commands.run("exit 3")
    raise AssertionError("a failing command raises")
except CommandExitException as e:
    assert e.exit_code == 3, e
assert sbx.commands.run("exit 4", check=False).exit_code == 4

sbx.files.write("/workspace/notes/a.txt", "hello files")
assert sbx.files.read("/workspace/notes/a.txt") == "hello files"
sbx.files.write("/workspace/bin.dat", bytes(range(256)))
assert sbx.files.read("/workspace/bin.dat", format="bytes") == bytes(range(256))
names = sorted(e.name for e in sbx.files.list("/workspace"))
assert names == ["bin.dat", "notes"], names
assert sbx.files.exists("/workspace/notes/a.txt") and not sbx.files.exists("/workspace/nope")
sbx.files.remove("/workspace/bin.dat")
assert not sbx.files.exists("/workspace/bin.dat")

# The guard answers as an error a program can read.
try:
    sbx.commands.run("cat /etc/shadow")
    raise AssertionError("the guard refuses")
except TesseraError as e:
    assert e.status == 403, e

# Pause to disk, then connect (which resumes): the files are back.
sbx.set_timeout(60)
sid = sbx.pause()
assert Sandbox.list()[0].state == "paused"
again = Sandbox.connect(sid)
assert again.get_info().state == "running"
assert again.files.read("/workspace/notes/a.txt") == "hello files"

assert again.kill() is True
assert sbx.kill() is False
assert not again.is_running()

# A context manager kills its sandbox.
with Sandbox.create(timeout=60) as s2:
    s2.files.write("/workspace/main.py", "print(6 * 7)")
    assert s2.commands.run("python3 /workspace/main.py").stdout == "42\n"
    sid2 = s2.sandbox_id
assert all(i.sandbox_id != sid2 for i in Sandbox.list())
print("OK")
