#!/usr/bin/env python3
"""The stream-leak attack of issue 53, from outside, on a weir binary.

An h2c upstream (python-h2) answers a POST at once and never reads its
body: no WINDOW_UPDATE, no RST_STREAM. CLIENTS h2c clients (python-h2, raw
sockets) each POST 100 KB (`content-length: 100000`) through weir, read
the answer and disconnect. Then, with no client left, one GET goes through
weir to the same upstream. Prints weir's RSS before the attack, right after
it and 2 s later, the GET's status and time, and how many of the POST
streams weir reset.

    python3 bench/stream-leak.py [WEIR_BINARY] [CLIENTS]

Needs Python's `h2` package (pip install h2). Binds loopback ports only and
stops what it started.
"""
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import h2.config
import h2.connection
import h2.events

WEIR = sys.argv[1] if len(sys.argv) > 1 else "target/release/weir"
CLIENTS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
resets = 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


async def upstream_conn(reader, writer):
    """One upstream connection: POSTs answered at once, their bodies never
    read (the window is never given back); anything else gets `ok`."""
    global resets
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    posts = set()
    while True:
        try:
            data = await reader.read(65536)
        except (asyncio.CancelledError, ConnectionError):
            return
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                method = dict(ev.headers).get(b":method")
                if method == b"POST":
                    posts.add(ev.stream_id)
                    conn.send_headers(ev.stream_id, [(":status", "200")], end_stream=True)
                else:
                    conn.send_headers(ev.stream_id, [(":status", "200")])
                    conn.send_data(ev.stream_id, b"ok", end_stream=True)
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id in posts:
                resets += 1
            # DataReceived: never acknowledged, so the sender's window
            # stays spent.
        writer.write(conn.data_to_send())
        await writer.drain()


async def attacker(port):
    """POST 100 KB over h2c, as the window allows; read the answer; leave."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "svc"),
                          (":path", "/up"), ("content-length", "100000")])
    body = b"x" * 100000
    sent = 0
    status = None
    while status is None:
        n = min(conn.local_flow_control_window(1), conn.max_outbound_frame_size, len(body) - sent)
        while n > 0:
            conn.send_data(1, body[sent:sent + n], end_stream=sent + n == len(body))
            sent += n
            n = min(conn.local_flow_control_window(1), conn.max_outbound_frame_size, len(body) - sent)
        writer.write(conn.data_to_send())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(65536), 10)
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers).get(b":status")
        writer.write(conn.data_to_send())
    writer.close()
    return status


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def main():
    up_port, listen, admin = free_port(), free_port(), free_port()
    server = await asyncio.start_server(upstream_conn, "127.0.0.1", up_port)
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(f"""[server]
listen = "127.0.0.1:{listen}"
admin = "127.0.0.1:{admin}"
[upstreams.svc]
url = "http://127.0.0.1:{up_port}"
hosts = ["svc"]
protocol = "h2c"
timeout = "3s"
""")
    cfg.close()
    weir = subprocess.Popen([WEIR, "run", "--config", cfg.name], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", listen), 0.1).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        before = rss_kb(weir.pid)
        statuses = []
        for i in range(0, CLIENTS, 20):
            statuses += await asyncio.gather(*(attacker(listen) for _ in range(min(20, CLIENTS - i))))
        after = rss_kb(weir.pid)
        t0 = time.monotonic()
        r, w = await asyncio.open_connection("127.0.0.1", listen)
        w.write(b"GET /ok HTTP/1.1\r\nhost: svc\r\nconnection: close\r\n\r\n")
        answer = await asyncio.wait_for(r.read(), 10)
        took = time.monotonic() - t0
        await asyncio.sleep(2)
        later = rss_kb(weir.pid)
        ok = sum(1 for s in statuses if s == b"200")
        print(f"| clients (POST 100 KB, answered 200) | {len(statuses)} ({ok}) |")
        print(f"| streams weir reset | {resets} |")
        print(f"| GET after the attack | {answer.split(b' ')[1].decode()} in {took * 1000:.1f} ms |")
        print(f"| weir RSS before / right after / 2 s after | {before / 1024:.1f} / {after / 1024:.1f} / {later / 1024:.1f} MB |")
    finally:
        weir.send_signal(signal.SIGTERM)
        weir.wait(10)
        server.close()
        os.unlink(cfg.name)


asyncio.run(main())
