#!/usr/bin/env python3
"""A real OTLP trace receiver for tests/tracing.rs: the collector's own
protobuf messages (the `opentelemetry-proto` package) over gRPC (grpcio) or
HTTP/protobuf (the standard library's http.server).

    otlp_receiver.py --out FILE [--protocol grpc|http] [--delay SECONDS]
                     [--lifetime SECONDS]

Every span received is appended to FILE as one JSON line:
{"service", "trace_id", "span_id", "parent_span_id" (hex, "" for none),
"name", "kind" (SERVER, CLIENT…), "attributes" {key: value}, "events"
[{"name", "attributes"}], "status" (UNSET, OK, ERROR), "start", "end"
(unix nanoseconds)}. --delay holds every export that long before answering
(a slow collector). Binds 127.0.0.1:0, prints exactly one line
`PORT <n>`, then serves until killed (or until --lifetime, default 120 s).
"""

import argparse
import http.server
import json
import os
import threading
import time
from concurrent import futures

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

LOCK = threading.Lock()
SERVERS = []


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


DELAY = 0.0


def record(out, request):
    if DELAY:
        time.sleep(DELAY)
    lines = []
    for rs in request.resource_spans:
        service = attrs(rs.resource.attributes).get("service.name", "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                lines.append(json.dumps({
                    "service": service,
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": trace_pb2.Span.SpanKind.Name(s.kind).replace("SPAN_KIND_", ""),
                    "attributes": attrs(s.attributes),
                    "events": [{"name": e.name, "attributes": attrs(e.attributes)} for e in s.events],
                    "status": trace_pb2.Status.StatusCode.Name(s.status.code).replace("STATUS_CODE_", ""),
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                }))
    with LOCK, open(out, "a") as f:
        for line in lines:
            f.write(line + "\n")


def serve_grpc(out):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            record(out, request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    # grpcio stops a server its last reference lets go of: keep it.
    SERVERS.append(server)
    return port


def serve_http(out):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            record(out, request)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    SERVERS.append(server)
    return server.server_address[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--lifetime", type=float, default=120.0)
    args = p.parse_args()
    global DELAY
    DELAY = args.delay
    port = serve_grpc(args.out) if args.protocol == "grpc" else serve_http(args.out)
    print("PORT %d" % port, flush=True)
    threading.Event().wait(args.lifetime)
    os._exit(0)


if __name__ == "__main__":
    main()
