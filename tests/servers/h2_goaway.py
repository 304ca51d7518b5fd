#!/usr/bin/env python3
"""An HTTP/2 cleartext (prior knowledge) upstream built on hyper-h2, for
tests that need a third-party HTTP/2 server rather than hyper.

    h2_goaway.py [--streams N] [--log PATH] [--lifetime SECONDS]

Binds 127.0.0.1:0 and prints exactly one line, `PORT <n>`, then serves until
killed (or until --lifetime, default 120 s, has passed).

Each request is answered 200 with the body `ok <method> <path>\\n` and an
`x-stream-id` response header, once its stream has ended.

After N request streams have been accepted on a connection (N = --streams,
0 = never) the server sends a graceful GOAWAY(NO_ERROR) whose
last_stream_id is the Nth stream's id, finishes answering the streams up to
that id, never processes (answers, counts or logs) streams above it, and
closes the connection once the accepted ones are answered.

Like nginx, a request that carries a regular `host` header as well as
`:authority` (RFC 9113 section 8.3.1) is answered 400; such a request counts
as an accepted stream but is not logged as processed.

--log PATH appends one line per processed request,
`<method> <path> <x-request-id or ->`, flushed per line, so a test can count
deliveries per request id.
"""

import argparse
import asyncio
import os
import socket
import sys
import threading

import h2.config
import h2.connection
import h2.events
from hyperframe.frame import GoAwayFrame


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=0)
    p.add_argument("--log", default=None)
    p.add_argument("--lifetime", type=float, default=120.0)
    return p.parse_args()


class Log:
    def __init__(self, path):
        self.file = open(path, "a", encoding="utf-8") if path else None

    def line(self, text):
        if self.file is not None:
            self.file.write(text + "\n")
            self.file.flush()


class Connection:
    def __init__(self, reader, writer, limit, log):
        self.reader = reader
        self.writer = writer
        self.limit = limit
        self.log = log
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding="utf-8",
            # Our own checks below (a `host` next to `:authority` is a 400,
            # not a connection error as hyper-h2 would make it).
            validate_inbound_headers=False,
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.accepted = 0
        self.last_stream_id = None  # set once the GOAWAY has been sent
        self.requests = {}  # stream id -> [headers dict, body bytes]
        self.closed = False

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    def goaway(self, last_stream_id):
        # hyper-h2's close_connection() moves its state machine to CLOSED,
        # after which it refuses to send the responses a graceful GOAWAY
        # promises. So the frame is written by hand after whatever hyper-h2
        # has queued, and hyper-h2 keeps serving the accepted streams.
        self.flush()
        self.last_stream_id = last_stream_id
        frame = GoAwayFrame(stream_id=0, last_stream_id=last_stream_id, error_code=0)
        self.writer.write(frame.serialize())

    def respond(self, stream_id, status, body, extra=()):
        headers = [
            (":status", str(status)),
            ("content-type", "text/plain"),
            ("content-length", str(len(body))),
            ("x-stream-id", str(stream_id)),
        ]
        headers.extend(extra)
        self.conn.send_headers(stream_id, headers)
        self.conn.send_data(stream_id, body, end_stream=True)

    def on_request(self, event):
        sid = event.stream_id
        if self.last_stream_id is not None and sid > self.last_stream_id:
            return  # beyond the GOAWAY: never processed
        self.accepted += 1
        headers = {}
        regular_host = False
        for name, value in event.headers:
            if name == "host":
                regular_host = True
            headers.setdefault(name, value)
        self.requests[sid] = [headers, b"", regular_host]
        if self.limit and self.accepted == self.limit:
            self.goaway(sid)

    def on_end(self, sid):
        entry = self.requests.pop(sid, None)
        if entry is None:
            return  # a stream above the GOAWAY, or already reset
        headers, _body, regular_host = entry
        method = headers.get(":method", "-")
        path = headers.get(":path", "-")
        if regular_host:
            self.respond(sid, 400, b"host header alongside :authority\n")
            return
        self.log.line("%s %s %s" % (method, path, headers.get("x-request-id", "-")))
        self.respond(sid, 200, ("ok %s %s\n" % (method, path)).encode())

    def handle(self, events):
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.on_request(event)
                if event.stream_ended is not None:
                    self.on_end(event.stream_id)
            elif isinstance(event, h2.events.DataReceived):
                # Keep flow control open for every stream, processed or not.
                self.conn.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )
                entry = self.requests.get(event.stream_id)
                if entry is not None:
                    entry[1] += event.data
                if event.stream_ended is not None:
                    self.on_end(event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                # Already handled through stream_ended on the event above;
                # on_end is idempotent (the entry is popped).
                self.on_end(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.requests.pop(event.stream_id, None)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closed = True

    def done(self):
        return self.closed or (self.last_stream_id is not None and not self.requests)

    async def run(self):
        self.conn.initiate_connection()
        self.flush()
        try:
            while not self.done():
                data = await self.reader.read(65536)
                if not data:
                    return
                try:
                    events = self.conn.receive_data(data)
                except Exception as e:  # a protocol error: say so and stop
                    print("h2_goaway: %r" % (e,), file=sys.stderr, flush=True)
                    self.flush()
                    return
                self.handle(events)
                self.flush()
                await self.writer.drain()
            # Graceful close: stop writing, let the peer read everything we
            # sent (a close with unread input would be a RST that can
            # discard it), and wait briefly for its own close.
            await self.writer.drain()
            if self.writer.can_write_eof():
                self.writer.write_eof()
            try:
                await asyncio.wait_for(self.drain_input(), timeout=2.0)
            except asyncio.TimeoutError:
                pass
        finally:
            self.writer.close()

    async def drain_input(self):
        while await self.reader.read(65536):
            pass


async def main():
    args = parse_args()
    log = Log(args.log)

    async def on_connection(reader, writer):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await Connection(reader, writer, args.streams, log).run()
        except (ConnectionError, OSError):
            pass

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print("PORT %d" % port, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    lifetime = parse_args().lifetime
    timer = threading.Timer(lifetime, lambda: os._exit(0))
    timer.daemon = True
    timer.start()
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
