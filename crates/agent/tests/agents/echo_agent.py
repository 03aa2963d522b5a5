# A stdlib-only agent serving the agent contract on $TESSERA_AGENT_SOCKET:
# GET /ping -> Healthy, POST /invocations -> echo. AGENT_MODE=stop_ping makes
# it stop answering /ping after its first invocation (to test restarts).
import http.server, json, os, socketserver

state = {"n": 0}
mode = os.environ.get("AGENT_MODE", "")

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def reply(self, code, body, extra=None):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/ping":
            if mode == "stop_ping" and state["n"] > 0:
                self.reply(503, "Unhealthy")
            else:
                self.reply(200, json.dumps({"status": "Healthy"}))
        else:
            self.reply(404, "no")
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        state["n"] += 1
        req = json.loads(body or b"null")
        calls = {}
        if isinstance(req, dict) and "memory_put" in req:
            sid = req["memory_put"]
            calls["status"] = tessera("PUT", f"/v1/sessions/{sid}/memory/k", {"value": req.get("value")})
        out = {"calls": calls, "echo": json.loads(body or b"null"), "session": os.environ.get("TESSERA_SESSION_ID"),
               "pid": os.getpid(), "count": state["n"], "has_url": bool(os.environ.get("TESSERA_URL"))}
        self.reply(200, json.dumps(out), {"Content-Type": "application/json",
                                          "X-Tessera-Usage": json.dumps({"tokens_in": 10, "tokens_out": 5})})

def tessera(method, path, body=None):
    """Calls the control plane through $TESSERA_URL (a unix socket)."""
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["TESSERA_URL"][len("unix://"):])
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: tessera\r\nConnection: close\r\n"
            f"Authorization: Bearer {os.environ['TESSERA_API_KEY']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    s.sendall(head.encode() + data)
    resp = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        resp += c
    return int(resp.split(b" ")[1])

class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

path = os.environ["TESSERA_AGENT_SOCKET"]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
S(path, H).serve_forever()
