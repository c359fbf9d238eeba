"""The judge's HTTP: one request to an OpenAI-compatible endpoint within a total time limit.

``timeout_s`` is the whole request's limit (connecting through a proxy, the TLS handshake, the headers,
the body), however slowly the answer trickles in; an answer larger than a chat completion may be is
refused (``BadAnswerError``). Used by ``pipeline.scoring.judges``.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import urllib.parse
import urllib.request
from typing import Any, Mapping, cast

MAX_RESPONSE_BYTES = 8 * 2**20  # a chat completion of 2,048 tokens is some kilobytes


class BadAnswerError(ValueError):
    """The endpoint answered, with something that is not a chat completion (or larger than one may be)."""


class _Deadline:
    """A request's total time limit: when it is up, every socket of the request is shut down, which ends
    whatever call is blocked on it (connecting through a proxy, the TLS handshake, the headers, the body).
    Socket timeouts alone bound each read, not their sum: a judge that trickles a byte a second would
    hold a request forever."""

    def __init__(self, seconds: float):
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def cancel(self) -> None:
        with self._lock:
            self._timer.cancel()
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    try:  # the plain socket's shutdown, also for a TLS socket (no TLS close-notify from this thread)
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # closed already, or never connected


class _HTTPConnection(http.client.HTTPConnection):
    """An HTTP connection whose sockets a :class:`_Deadline` watches from the moment they connect."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = self._watched_connection

    def _watched_connection(self, *args: Any, **kwargs: Any) -> socket.socket:
        sock = socket.create_connection(*args, **kwargs)
        self._deadline.watch(sock)
        return sock


class _HTTPSConnection(http.client.HTTPSConnection):
    """Likewise over TLS: the TLS socket is watched before its handshake."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = self._watched_connection

    _watched_connection = cast(Any, _HTTPConnection._watched_connection)  # the same method, on this class too

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, and the proxy's CONNECT tunnel when there is one
        this: Any = self  # _context and _tunnel_host are HTTPSConnection's private attributes (untyped)
        sock = this._context.wrap_socket(
            self.sock, server_hostname=this._tunnel_host or self.host, do_handshake_on_connect=False
        )
        self._deadline.watch(sock)  # the plain socket was detached by the wrap: this one holds the descriptor
        sock.do_handshake()
        self.sock = sock


def http_request(
    url: str,
    headers: Mapping[str, str],
    timeout_s: float,
    payload: Mapping[str, Any] | None = None,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> tuple[int, str, bytes]:
    """POST ``payload`` as JSON (GET without one); ``(status, reason, body)`` within ``timeout_s`` in all
    (``TimeoutError`` otherwise), a body of at most ``max_bytes`` (``BadAnswerError`` beyond). Proxies as
    urllib takes them from the environment (``https_proxy``, ``http_proxy``, ``no_proxy``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"judge URL {url!r} is not an http:// or https:// URL")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    headers = dict(headers)
    proxy = None if urllib.request.proxy_bypass(parts.hostname) else urllib.request.getproxies().get(parts.scheme)
    deadline = _Deadline(timeout_s)
    kind = _HTTPSConnection if parts.scheme == "https" else _HTTPConnection
    if proxy:
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        proxy_headers = {}
        if proxy_parts.username:
            login = f"{urllib.parse.unquote(proxy_parts.username)}:{urllib.parse.unquote(proxy_parts.password or '')}"
            proxy_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(login.encode()).decode()
        if parts.scheme == "https":
            conn = kind(proxy_parts.hostname, proxy_parts.port or 8080, timeout=timeout_s, deadline=deadline)
            conn.set_tunnel(parts.hostname, parts.port or 443, headers=proxy_headers)
        else:
            conn = kind(proxy_parts.hostname, proxy_parts.port or 8080, timeout=timeout_s, deadline=deadline)
            target, headers = url, {**headers, **proxy_headers}
    else:
        conn = kind(parts.hostname, parts.port, timeout=timeout_s, deadline=deadline)
    try:
        if payload is None:
            conn.request("GET", target, headers=headers)
        else:
            conn.request("POST", target, body=json.dumps(payload).encode(), headers=headers)
        response = conn.getresponse()
        if response.length is not None and response.length > max_bytes:
            raise BadAnswerError(f"the answer is larger than {max_bytes} bytes ({response.length})")
        # With a Content-Length, read() without a size raises IncompleteRead when the answer breaks off
        # (read(n) would return the part silently); without one (chunked, or to the end), at most max_bytes + 1.
        body = response.read() if response.length is not None else response.read(max_bytes + 1)
        if deadline.expired:
            raise TimeoutError(f"no complete answer within {timeout_s} s")
        if len(body) > max_bytes:
            raise BadAnswerError(f"the answer is larger than {max_bytes} bytes")
        return response.status, response.reason, body
    except (OSError, http.client.HTTPException) as err:
        if deadline.expired:
            raise TimeoutError(f"no complete answer within {timeout_s} s") from None
        raise err
    finally:
        deadline.cancel()
        conn.close()
