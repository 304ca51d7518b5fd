#!/usr/bin/env python3
"""A grpcio client for tests/servers/grpc_stream.py (raw-bytes messages, no
generated code).

    grpc_client.py --target HOST:PORT [--method Ticks|Echo] [--timeout SECONDS]
                   [--authority NAME] [--message TEXT]

Prints one line per received message, `<seconds since the call started, 3
decimals> <message>`, flushed as it arrives, then `STATUS <code name>`
(plus `DETAILS <text>` when the status is not OK). Exits 0 on OK, 1
otherwise. --authority sets the channel's `grpc.default_authority` (the
:authority a proxy routes by). Proxy environment variables are ignored.
"""

import argparse
import sys
import time

import grpc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--method", default="Ticks", choices=["Ticks", "Echo"])
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--authority", default=None)
    p.add_argument("--message", default="")
    args = p.parse_args()

    options = [("grpc.enable_http_proxy", 0)]
    if args.authority:
        options.append(("grpc.default_authority", args.authority))
    channel = grpc.insecure_channel(args.target, options=options)
    path = "/weir.test.Stream/" + args.method
    request = args.message.encode()
    start = time.monotonic()

    def show(message):
        print("%.3f %s" % (time.monotonic() - start, message.decode(errors="replace")), flush=True)

    code = grpc.StatusCode.OK
    details = ""
    try:
        if args.method == "Ticks":
            call = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
            for message in call(request, timeout=args.timeout):
                show(message)
        else:
            call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            show(call(request, timeout=args.timeout))
    except grpc.RpcError as e:
        code = e.code()
        details = e.details() or ""
    finally:
        channel.close()
    print("STATUS %s" % code.name, flush=True)
    if code != grpc.StatusCode.OK:
        print("DETAILS %s" % details, flush=True)
    sys.exit(0 if code == grpc.StatusCode.OK else 1)


if __name__ == "__main__":
    main()
