# An agent that attacks its walls: code inside a session's sandbox, as a hostile
# model would write it. POST /invocations {"do": [STEP, ...]} runs each step and
# answers a report, one entry per step:
#   {"api": [METHOD, PATH, BODY]}  -> the status of that call with the session's key,
#                                     through the in-sandbox API socket
#   {"run": "SHELL LINE"}          -> {"rc", "out", "err"} or {"error"} (an exec the
#                                     guard refused fails with EPERM)
#   {"read": PATH}                 -> {"data"} or {"error"}
#   {"say": TEXT}                  -> TEXT, in the reply (output leaving the sandbox)
#   {"stderr": TEXT}               -> TEXT printed on stderr (the session's output)
import http.server, json, os, socketserver, subprocess, sys


def tessera(method, path, body=None):
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


def step(st):
    if "api" in st:
        m, p, b = st["api"]
        return tessera(m, p, b)
    if "run" in st:
        try:
            r = subprocess.run(["sh", "-c", st["run"]], capture_output=True, timeout=20)
            return {"rc": r.returncode, "out": r.stdout.decode(errors="replace"),
                    "err": r.stderr.decode(errors="replace")}
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
    if "read" in st:
        try:
            with open(st["read"], "rb") as f:
                return {"data": f.read(4096).decode(errors="replace")}
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
    if "say" in st:
        return st["say"]
    if "stderr" in st:
        print(st["stderr"], file=sys.stderr, flush=True)
        return "printed"
    return "unknown step"


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, json.dumps({"status": "Healthy"}) if self.path == "/ping" else "{}")

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n) or b"{}")
        self.reply(200, json.dumps({"report": [step(s) for s in req.get("do", [])]}))


class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


path = os.environ["TESSERA_AGENT_SOCKET"]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
S(path, H).serve_forever()
