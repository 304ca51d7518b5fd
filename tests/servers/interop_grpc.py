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
        * `Upload` (client streaming): reads every message, then answers
          "<messages> messages, <bytes> bytes" with trailing metadata
          `x-messages`.
    interop_grpc.py client --target HOST:PORT --method Digest|Refuse|Upload --body FILE
            [--messages N] [--every-ms MS]
        Prints one JSON object: {"code", "details", "response", "trailing":
        {name: value}, "ms"}. For `Upload`, the file's bytes are sent as
        each of N messages (default 10), MS milliseconds apart (default
        100).
"""

import argparse
import hashlib
import json
import sys
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

    handler = grpc.method_handlers_generic_handler(
        "weir.interop.Matrix",
        {
            name: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=identity, response_serializer=identity
            )
            for name, fn in (("Digest", digest), ("Refuse", refuse))
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    def upload(requests, context):
        n, size = 0, 0
        for m in requests:
            n += 1
            size += len(m)
        context.set_trailing_metadata((("x-messages", str(n)),))
        return ("%d messages, %d bytes" % (n, size)).encode()

    streams = grpc.method_handlers_generic_handler(
        "weir.interop.Matrix",
        {
            "Upload": grpc.stream_unary_rpc_method_handler(
                upload, request_deserializer=identity, response_serializer=identity
            )
        },
    )
    server.add_generic_rpc_handlers((handler, streams))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("PORT %d" % port, flush=True)
    server.wait_for_termination()


def client(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--method", required=True, choices=["Digest", "Refuse", "Upload"])
    p.add_argument("--body", required=True)
    p.add_argument("--messages", type=int, default=10)
    p.add_argument("--every-ms", type=int, default=100)
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
    if args.method == "Upload":
        call = channel.stream_unary(
            "/weir.interop.Matrix/Upload", request_serializer=None, response_deserializer=None
        )

        def messages():
            for i in range(args.messages):
                if i:
                    time.sleep(args.every_ms / 1000.0)
                yield body

        request = messages()
    else:
        request = body
    out = {"code": "OK", "details": "", "response": None, "trailing": {}}
    started = time.monotonic()
    try:
        response, c = call.with_call(request, timeout=30)
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
