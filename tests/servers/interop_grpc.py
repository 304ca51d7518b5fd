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
        * `Flaky` (unary), for weir's gRPC policies: the request is text,
          `KEY N CODE` (the first N calls with KEY fail with CODE, the rest
          answer OK), `rand KEY CODE` (30 % of calls fail with CODE, from a
          seeded random source) or `count KEY` (answers the calls seen with
          KEY, without counting itself). An OK answer is `ok <calls>` with
          trailing metadata `x-calls: <calls>`; a failure is trailers-only.
        * `Pushback` (unary): the request's bytes are a
          `grpc-retry-pushback-ms` value (`-1`, `2000`). The first call
          with those bytes fails UNAVAILABLE with that trailing metadata;
          a later one answers JSON {"calls": n, "gap_ms": ms since the
          first}.
        * `Count` (unary): JSON {"calls": n} — the `Pushback` calls made
          with these bytes so far (0 for none).
        * `Upload` (client streaming): reads every message, then answers
          "<messages> messages, <bytes> bytes" with trailing metadata
          `x-messages`.
    interop_grpc.py client --target HOST:PORT --method METHOD --body FILE
            [--metadata KEY=VALUE ...] [--messages N] [--every-ms MS]
        Prints one JSON object: {"code", "details", "response", "trailing":
        {name: value}, "ms"}. For `Upload`, the file's bytes are sent as
        each of N messages (default 10), MS milliseconds apart (default
        100).
    interop_grpc.py calls --target HOST:PORT --request TEXT --n N [--key K]
        N unary `Flaky` calls one after another (with `idempotency-key: K`
        metadata when given); prints one JSON object: {"codes": {CODE: n},
        "calls": [{"code", "details", "response", "trailing", "replayed"}]}
        (the calls listed only up to 20).
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

    import random

    seen = {}
    lock = threading.Lock()
    rng = random.Random(54)

    def flaky(request, context):
        words = request.decode().split()
        if words[0] == "count":
            with lock:
                return ("%d" % seen.get(words[1], 0)).encode()
        mode, key = (words[0], words[1]) if words[0] == "rand" else ("first", words[0])
        with lock:
            seen[key] = seen.get(key, 0) + 1
            n = seen[key]
            fail = rng.random() < 0.3 if mode == "rand" else n <= int(words[1])
        if fail:
            context.abort(getattr(grpc.StatusCode, words[-1]), "failed on purpose")
        context.set_trailing_metadata((("x-calls", str(n)),))
        return ("ok %d" % n).encode()

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
                ("Flaky", flaky),
            )
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
    p.add_argument("--method", required=True)
    p.add_argument("--body", required=True)
    p.add_argument("--metadata", action="append", default=[], help="KEY=VALUE")
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
        metadata = tuple(tuple(m.split("=", 1)) for m in args.metadata)
        response, c = call.with_call(request, timeout=30, metadata=metadata)
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


def calls(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--request", required=True)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--key")
    args = p.parse_args(argv)
    channel = grpc.insecure_channel(args.target, options=[("grpc.enable_http_proxy", 0)])
    call = channel.unary_unary(
        "/weir.interop.Matrix/Flaky", request_serializer=None, response_deserializer=None
    )
    metadata = (("idempotency-key", args.key),) if args.key else None
    out = {"codes": {}, "calls": []}
    started = time.monotonic()
    for _ in range(args.n):
        one = {"code": "OK", "details": "", "response": None, "trailing": {}, "replayed": None}
        try:
            response, c = call.with_call(args.request.encode(), timeout=10, metadata=metadata)
            one["response"] = response.decode(errors="replace")
            one["trailing"] = {k: v for k, v in c.trailing_metadata()}
            one["replayed"] = dict(c.initial_metadata()).get("idempotent-replayed")
        except grpc.RpcError as e:
            one["code"] = e.code().name
            one["details"] = e.details() or ""
            one["trailing"] = {k: v for k, v in (e.trailing_metadata() or ())}
        out["codes"][one["code"]] = out["codes"].get(one["code"], 0) + 1
        if len(out["calls"]) < 20:
            out["calls"].append(one)
    channel.close()
    out["ms"] = int((time.monotonic() - started) * 1000)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["calls"]:
        calls(sys.argv[2:])
    elif sys.argv[1:2] == ["server"]:
        try:
            serve()
        except KeyboardInterrupt:
            pass
    else:
        client(sys.argv[2:])
