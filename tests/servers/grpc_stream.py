#!/usr/bin/env python3
"""A grpcio server with no generated code, for tests that need a real gRPC
implementation rather than hyper.

    grpc_stream.py [--count N] [--every SECONDS] [--lifetime SECONDS]

Service `weir.test.Stream`:
  * `Ticks` (server streaming): ignores the request bytes and sends --count
    (default 8) messages, the bytes `tick <i>` for i = 0.., --every seconds
    apart (default 0.5), then ends with status OK.
  * `Echo` (unary): returns the request bytes.

Messages are raw bytes (identity serializers), not protobuf. Binds
127.0.0.1:0, prints exactly one line `PORT <n>`, then serves until killed (or
until --lifetime, default 120 s, has passed).
"""

import argparse
import os
import threading
import time
from concurrent import futures

import grpc


def identity(b):
    return b


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--lifetime", type=float, default=120.0)
    args = p.parse_args()

    timer = threading.Timer(args.lifetime, lambda: os._exit(0))
    timer.daemon = True
    timer.start()

    def ticks(request, context):
        for i in range(args.count):
            if i and args.every > 0:
                time.sleep(args.every)
            if not context.is_active():
                return
            yield ("tick %d" % i).encode()

    def echo(request, context):
        return request

    handler = grpc.method_handlers_generic_handler(
        "weir.test.Stream",
        {
            "Ticks": grpc.unary_stream_rpc_method_handler(
                ticks, request_deserializer=identity, response_serializer=identity
            ),
            "Echo": grpc.unary_unary_rpc_method_handler(
                echo, request_deserializer=identity, response_serializer=identity
            ),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("PORT %d" % port, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
