"""An OpenAI-compatible judge on loopback: a real HTTP server (``http.server``), no network beyond 127.0.0.1.

``JudgeServer(reply)`` answers ``POST /v1/chat/completions`` with ``reply(body)`` as the assistant's
text (default: "Fine. Rating: [[rating]]") and ``GET /v1/models`` with ``models``. It records what it
was sent (``requests``: the JSON bodies answered, ``auth``: the Authorization headers of every POST,
``model_requests``), answers 503 to the first ``fail_first`` completions and 500 to all of them while
``healthy`` is False. The reported model is the requested one plus ``version`` (e.g. "-0613"), with
``fingerprint`` as ``system_fingerprint`` when given. Use it as a context manager.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class JudgeServer:
    def __init__(
        self,
        reply: Callable[[dict], str] | None = None,
        *,
        rating: int = 7,
        fail_first: int = 0,
        models: tuple[str, ...] = ("tiny-judge",),
        version: str = "",
        fingerprint: str | None = None,
    ):
        self.reply = reply or (lambda body: f"Fine. Rating: [[{rating}]]")
        self.fail_first = fail_first
        self.healthy = True
        self.requests: list[dict] = []
        self.auth: list[str | None] = []
        self.model_requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                if self.path != "/v1/models":
                    self.send_error(404)
                    return
                outer.model_requests += 1
                self._send({"object": "list", "data": [{"id": m, "object": "model"} for m in models]})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.auth.append(self.headers.get("Authorization"))
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                if not outer.healthy:
                    self.send_error(500, "judge down")
                    return
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_error(503, "busy")
                    return
                outer.requests.append(body)
                payload = {
                    "id": "x",
                    "object": "chat.completion",
                    "model": body["model"] + version,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": outer.reply(body)},
                            "finish_reason": "stop",
                        }
                    ],
                }
                if fingerprint:
                    payload["system_fingerprint"] = fingerprint
                self._send(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def chat_requests(self) -> int:
        """Chat completions answered with a judgment."""
        return len(self.requests)

    def __enter__(self) -> "JudgeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
