"""A stand-in for llama-server that misbehaves on purpose, for the supervisor's tests.

Run as ``python hang_server.py MODE [llama-server options…] --host H --port P`` (the supervisor
appends --host/--port). It never speaks the parent–child protocol. Modes:

- ``503``: listens and answers every request with 503 forever (a load that never ends).
- ``silent``: never listens; ignores SIGTERM and never reads stdin (only SIGKILL ends it).
- ``ok``: listens and answers 200 (ready by ``/health`` alone); SIGTERM ends it.
- ``ok-ignore-term``: like ``ok`` but ignores SIGTERM, so a stop has to SIGKILL it.
- ``bind-fail-first``: the first run (no file at $HANG_STATE yet) logs llama-server's
  "couldn't bind" line and exits 1; later runs behave like ``ok``.
- ``crash``: logs a few lines (one not UTF-8) and an error line, then exits 3.
- ``protocol-slow``: speaks the protocol: says ``loading``, answers 503 (logging
  ``probed while loading``) for 1.5 s, then says ``ready`` and answers 200.
"""

from __future__ import annotations

import http.server
import os
import signal
import sys
import threading
import time

LOADING = 'cmd_child_to_router:state:{"state":"loading","payload":null}'
READY = 'cmd_child_to_router:state:{"state":"ready","payload":{"id":"slow"}}'


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        if self.status == 503:
            print("probed while loading", file=sys.stderr, flush=True)
        body = b'{"status":"ok"}' if self.status == 200 else b'{"error":"loading"}'
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep stderr for the lines the tests look for


def _serve(host: str, port: int, status: int) -> None:
    _Handler.status = status
    server = http.server.HTTPServer((host, port), _Handler)
    print(f"listening on http://{host}:{port}", file=sys.stderr, flush=True)
    server.serve_forever()


def main(argv: list[str]) -> int:
    mode = argv[0]
    host = argv[argv.index("--host") + 1]
    port = int(argv[argv.index("--port") + 1])
    print(f"hang_server {mode} starting", file=sys.stderr, flush=True)
    if mode == "silent":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    if mode == "crash":
        sys.stderr.buffer.write(b"loading model \xff\xfe bytes that are not utf-8\n")
        print("0.00.002.452 E srv  load_model: failed to load model 'x.gguf'", file=sys.stderr)
        print("cleaning up", file=sys.stderr, flush=True)
        return 3
    if mode == "bind-fail-first":
        state = os.environ["HANG_STATE"]
        if not os.path.exists(state):
            open(state, "w").close()
            print(
                f"E srv  start: couldn't bind HTTP server socket, hostname: {host}, port: {port}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        mode = "ok"
    if mode == "protocol-slow":
        _Handler.status = 503
        server = http.server.HTTPServer((host, port), _Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(LOADING, flush=True)
        time.sleep(1.5)
        _Handler.status = 200
        print(READY, flush=True)
        sys.stdin.readline()  # the exit command, or EOF
        return 0
    if mode == "ok-ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _serve(host, port, 503 if mode == "503" else 200)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
