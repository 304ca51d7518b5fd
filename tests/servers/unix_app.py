#!/usr/bin/env python3
"""Python's http.server on a Unix-domain socket, for tests/unix_sockets.rs:

    unix_app.py PATH

serves on the socket file PATH (a socketserver.UnixStreamServer, one thread
per connection, HTTP/1.1 keep-alive) and answers every GET and POST with a
JSON record of what arrived: method, path, the Host header, the body's
length and SHA-256, and how many requests its connection has carried (so a
test can tell a pooled connection from a new one). Prints `PORT 0` once it
listens (the line tests/common/third_party.rs waits for; a socket has no port).
"""
import hashlib
import http.server
import json
import socketserver
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.served = 0

    def answer(self, body):
        self.served += 1
        record = {
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("Host"),
            "body_len": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "on_connection": self.served,
        }
        out = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        self.answer(b"")

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.answer(self.rfile.read(n))

    # A Unix socket's peer has no address to show.
    def address_string(self):
        return "unix"

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


if __name__ == "__main__":
    server = Server(sys.argv[1], Handler)
    print("PORT 0", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
