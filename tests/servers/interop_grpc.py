#!/usr/bin/env python3
"""grpcio on both ends of weir for tests/interop_matrix.rs: trailers (a
status with trailing metadata, and a trailers-only error) and a message's
bytes, checked by SHA-256 at the far end. Raw-bytes messages, no generated
code.

    interop_grpc.py server
        Service `weir.interop.Matrix`, on 127.0.0.1:0; prints `PORT <n>`.
        * `Digest` (unary): answers the hex SHA-256 of the request bytes, with
          trailing metadata `x-body-len` and `x-body-sha256`.
        * `Refuse` (unary): fails with FAILED_PRECONDITION, details
          "refused on purpose" and trailing metadata `x-why: test` (a
          trailers-only response).
        * `Pushback` (unary): the request's bytes are a
          `grpc-retry-pushback-ms` value (`-1`, `2000`). The first call
          with those bytes fails UNAVAILABLE with that trailing metadata;
          a later one answers JSON {"calls": n, "gap_ms": ms since the
          first}.
        * `Count` (unary): JSON {"calls": n} — the `Pushback` calls made
          with these bytes so far (0 for none).
    interop_grpc.py client --target HOST:PORT --method METHOD --body FILE
            [--metadata KEY=VALUE ...]
        Prints one JSON object: {"code", "details", "response", "trailing":
        {name: value}}.
"""

import argparse
import hashlib
import json
import sys
import threading
import time
from concurrent import futures

import grpc


def identity(b):
    return b


def serve():
    def digest(request, context):
        sha = hashlib.sha256(request).hexdigest()
        context.set_trailing_metadata((("x-body-len", str(len(request))), ("x-body-sha256", sha)))
        return sha.encode()

    def refuse(request, context):
        context.set_trailing_metadata((("x-why", "test"),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused on purpose")

    # Pushback's calls, by request bytes: when each came (monotonic).
    pushback_calls = {}
    pushback_lock = threading.Lock()

    def pushback(request, context):
        with pushback_lock:
            calls = pushback_calls.setdefault(request, [])
            calls.append(time.monotonic())
            n, first = len(calls), calls[0]
        if n == 1:
            value = request.decode(errors="replace")
            context.set_trailing_metadata((("grpc-retry-pushback-ms", value),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "pushback " + value)
        gap_ms = int((time.monotonic() - first) * 1000)
        return json.dumps({"calls": n, "gap_ms": gap_ms}).encode()

    def count(request, context):
        with pushback_lock:
            return json.dumps({"calls": len(pushback_calls.get(request, []))}).encode()

    handler = grpc.method_handlers_generic_handler(
        "weir.interop.Matrix",
        {
            name: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=identity, response_serializer=identity
            )
            for name, fn in (
                ("Digest", digest),
                ("Refuse", refuse),
                ("Pushback", pushback),
                ("Count", count),
            )
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("PORT %d" % port, flush=True)
    server.wait_for_termination()


def client(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--body", required=True)
    p.add_argument("--metadata", action="append", default=[], help="KEY=VALUE")
    args = p.parse_args(argv)
    with open(args.body, "rb") as f:
        body = f.read()
    channel = grpc.insecure_channel(
        args.target,
        options=[("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 64 << 20)],
    )
    call = channel.unary_unary(
        "/weir.interop.Matrix/" + args.method, request_serializer=None, response_deserializer=None
    )
    out = {"code": "OK", "details": "", "response": None, "trailing": {}}
    started = time.monotonic()
    try:
        metadata = tuple(tuple(m.split("=", 1)) for m in args.metadata)
        response, c = call.with_call(body, timeout=30, metadata=metadata)
        out["response"] = response.decode(errors="replace")
        out["trailing"] = {k: v for k, v in c.trailing_metadata()}
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["details"] = e.details() or ""
        out["trailing"] = {k: v for k, v in (e.trailing_metadata() or ())}
    finally:
        channel.close()
    out["ms"] = int((time.monotonic() - started) * 1000)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["server"]:
        try:
            serve()
        except KeyboardInterrupt:
            pass
    else:
        client(sys.argv[2:])
