"""A real HTTP receiver of OpenLineage events, started by the test on a loopback port:
it answers POST /api/v1/lineage as Marquez does (201), keeps every event it accepted,
and can be told to refuse the next ones (a receiver that is down)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LineageReceiver:
    def __init__(self, path: str = "/api/v1/lineage"):
        self.path = path
        self.events: list[dict] = []
        self.headers: list[dict] = []
        self.refusals = 0  # how many POSTs still to answer 503
        self.refused = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    if self.path != receiver.path:
                        status = 404
                    elif receiver.refusals > 0:
                        receiver.refusals -= 1
                        receiver.refused += 1
                        status = 503
                    else:
                        receiver.events.append(json.loads(body))
                        receiver.headers.append(dict(self.headers))
                        status = 201
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="lineage-receiver", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def refuse(self, count: int) -> None:
        with self._lock:
            self.refusals = count

    def of_run(self, run_uuid: str) -> list[dict]:
        return [e for e in self.events if e["run"]["runId"] == run_uuid]
