#!/usr/bin/env python3
"""One few-line app for tests/interop_matrix.rs, served three ways by
third-party Python servers:

    interop_app.py --state DIR     Python's http.server (ThreadingHTTPServer,
                                   BaseHTTPRequestHandler as shipped: HTTP/1.0
                                   answers, and a body read by its
                                   Content-Length only); binds 127.0.0.1:0 and
                                   prints `PORT <n>`
    gunicorn interop_app:wsgi_app  a WSGI app (reads wsgi.input to its end
                                   when the server says it is terminated, as
                                   gunicorn does and werkzeug reads it; else
                                   CONTENT_LENGTH bytes)
    uvicorn interop_app:asgi_app   an ASGI app (http.request messages until
                                   more_body is false)

The state directory (--state, or $INTEROP_STATE for the WSGI and ASGI apps)
keeps the markers of /flaky and /slow, so that every worker process shares
them.

Routes (`<id>` is the test's name for the request):

  /echo/<id>            200, a JSON record of what arrived (below)
  /check/<id>?len=N&sha=HEX
                        200 when the body arrived with `Content-Length: N`,
                        no Transfer-Encoding, and SHA-256 HEX; else 422; the
                        record either way
  /download/<id>?n=N    200, N bytes (byte i is i % 251), with Content-Length
  /status/204/<id>      204, no body
  /status/304/<id>      304 when If-None-Match is "v1", else 200 "fresh"
  /flaky/<id>           503 (with the record) the first time <id> is seen,
                        then 200 with the record
  /slow/<id>?ms=M       the first request for <id> waits M ms; then 200 with
                        the record

The record: {"server", "method", "path", "content_length",
"transfer_encoding", "expect", "idempotency_key" (each header as received,
or null), "body_len", "sha256" (of the body as the app read it), "seen"
(requests so far for <id> on /flaky and /slow, else 1)}.
"""

import asyncio
import hashlib
import json
import os
import sys
import time
from urllib.parse import parse_qs, urlsplit

PATTERN = bytes(range(251))


def download(n):
    return (PATTERN * (n // len(PATTERN) + 1))[:n]


def state_dir():
    return os.environ.get("INTEROP_STATE", "/tmp")


def seen(kind, ident):
    """How many requests for (kind, ident) have arrived, this one included."""
    path = os.path.join(state_dir(), "%s-%s" % (kind, ident.replace("/", "_")))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return os.path.getsize(path)


def plan(server, method, target, header, body):
    """What to answer: (status, [(name, value)], body bytes, delay seconds).
    `header(name)` is a request header's value or None; `body` the bytes
    the server's app read."""
    parts = urlsplit(target)
    path = parts.path
    query = parse_qs(parts.query)
    record = {
        "server": server,
        "method": method,
        "path": path,
        "content_length": header("content-length"),
        "transfer_encoding": header("transfer-encoding"),
        "expect": header("expect"),
        "idempotency_key": header("idempotency-key"),
        "body_len": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "seen": 1,
    }
    json_type = [("Content-Type", "application/json")]

    def answer(status, delay=0.0):
        return status, json_type, json.dumps(record).encode(), delay

    if path.startswith("/download/"):
        n = int(query.get("n", ["0"])[0])
        return 200, [("Content-Type", "application/octet-stream")], download(n), 0.0
    if path.startswith("/status/204/"):
        return 204, [], b"", 0.0
    if path.startswith("/status/304/"):
        if header("if-none-match") == '"v1"':
            return 304, [("ETag", '"v1"')], b"", 0.0
        return 200, [("ETag", '"v1"'), ("Content-Type", "text/plain")], b"fresh", 0.0
    if path.startswith("/flaky/"):
        record["seen"] = seen("flaky", path)
        return answer(503 if record["seen"] == 1 else 200)
    if path.startswith("/slow/"):
        record["seen"] = seen("slow", path)
        delay = int(query.get("ms", ["0"])[0]) / 1000.0 if record["seen"] == 1 else 0.0
        return answer(200, delay)
    if path.startswith("/check/"):
        ok = (
            record["content_length"] == query.get("len", [""])[0]
            and record["transfer_encoding"] is None
            and record["sha256"] == query.get("sha", [""])[0]
        )
        return answer(200 if ok else 422)
    if path.startswith("/echo/"):
        return answer(200)
    return 404, [("Content-Type", "text/plain")], b"no such route\n", 0.0


def with_length(status, headers, body):
    """The answer's headers with Content-Length, where a status has a body."""
    if status in (204, 304):
        return headers
    return headers + [("Content-Length", str(len(body)))]


# --- WSGI (gunicorn) --------------------------------------------------------

def wsgi_app(environ, start_response):
    stream = environ["wsgi.input"]
    if environ.get("wsgi.input_terminated"):
        body = stream.read()
    else:
        body = stream.read(int(environ.get("CONTENT_LENGTH") or 0))

    def header(name):
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_LENGTH", "CONTENT_TYPE"):
            return environ.get(key)
        return environ.get("HTTP_" + key)

    target = environ.get("RAW_URI") or (
        environ.get("PATH_INFO", "/") + ("?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else "")
    )
    status, headers, out, delay = plan("gunicorn", environ["REQUEST_METHOD"], target, header, body)
    if delay:
        time.sleep(delay)
    reason = {200: "OK", 204: "No Content", 304: "Not Modified", 404: "Not Found", 422: "Unprocessable Entity", 503: "Service Unavailable"}
    start_response("%d %s" % (status, reason.get(status, "X")), with_length(status, headers, out))
    return [out] if environ["REQUEST_METHOD"] != "HEAD" else []


# --- ASGI (uvicorn) ---------------------------------------------------------

async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    fields = {}
    for k, v in scope["headers"]:
        fields.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
    target = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    status, headers, out, delay = plan("uvicorn", scope["method"], target, fields.get, body)
    if delay:
        await asyncio.sleep(delay)
    raw = [(k.lower().encode(), v.encode()) for k, v in with_length(status, headers, out)]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": out if scope["method"] != "HEAD" else b""})


# --- http.server ------------------------------------------------------------

def serve_http_server():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def handle_any(self):
            # As most hand-written handlers do: Content-Length, or nothing.
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, headers, out, delay = plan(
                "http.server", self.command, self.path, self.headers.get, body
            )
            if delay:
                time.sleep(delay)
            self.send_response(status)
            for k, v in with_length(status, headers, out):
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(out)

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--state":
        os.environ["INTEROP_STATE"] = sys.argv[2]
    try:
        serve_http_server()
    except KeyboardInterrupt:
        pass
