#!/usr/bin/env python3
"""Python HTTP clients for tests/interop_matrix.rs: runs a batch of requests
and prints one JSON array of results.

    interop_client.py requests SPEC.json    Python `requests` (HTTP/1.1)
    interop_client.py httpx SPEC.json       `httpx` over HTTP/2 with prior
                                            knowledge (cleartext h2c:
                                            httpx.Client(http1=False,
                                            http2=True))

SPEC is a JSON array of requests: {"id", "method", "url", "headers": [[name,
value], ...], "body_file": a path or null, "chunked": send the body without
a length (HTTP/1.1 chunked; on HTTP/2, DATA frames without content-length),
"primer": a URL or null}. With a primer (`requests` only), the request goes
on a fresh connection whose first request is a GET of that URL with
`Expect: 100-continue`: weir's fast path hands such a connection to hyper's
path for good, so the request itself is served there.

A result: {"id", "status", "http_version", "headers": [[name, value], ...]
(names lower-case), "body_len", "sha256", "json" (the body, when it is a
JSON object), "error" (null, or what went wrong), "ms"}.
"""

import hashlib
import json
import sys
import time


def body_of(spec):
    if not spec.get("body_file"):
        return None
    with open(spec["body_file"], "rb") as f:
        data = f.read()
    if not spec.get("chunked"):
        return data

    def pieces():
        # A few writes, as a streaming client makes them.
        step = max(1, len(data) // 3)
        for i in range(0, len(data), step):
            yield data[i:i + step]

    return pieces()


def result(spec, status, version, headers, body, started, error=None):
    out = {
        "id": spec["id"],
        "status": status,
        "http_version": version,
        "headers": [[k.lower(), v] for k, v in headers],
        "body_len": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "json": None,
        "error": error,
        "ms": int((time.monotonic() - started) * 1000),
    }
    if body[:1] == b"{":
        try:
            out["json"] = json.loads(body)
        except ValueError:
            pass
    return out


def run_requests(specs):
    import requests

    results = []
    shared = requests.Session()
    shared.trust_env = False
    for spec in specs:
        started = time.monotonic()
        session = shared
        if spec.get("primer"):
            session = requests.Session()
            session.trust_env = False
        try:
            if spec.get("primer"):
                session.get(spec["primer"], headers={"Expect": "100-continue"}, timeout=30).content
            r = session.request(
                spec["method"],
                spec["url"],
                headers=dict(spec.get("headers") or []),
                data=body_of(spec),
                timeout=30,
                allow_redirects=False,
                stream=True,
            )
            body = r.raw.read(decode_content=False) or b""
            version = {10: "HTTP/1.0", 11: "HTTP/1.1"}.get(r.raw.version, str(r.raw.version))
            results.append(result(spec, r.status_code, version, list(r.raw.headers.items()), body, started))
        except Exception as e:  # noqa: BLE001 - every failure is a result
            results.append(result(spec, 0, "", [], b"", started, "%s: %s" % (type(e).__name__, e)))
        finally:
            if session is not shared:
                session.close()
    return results


def run_httpx(specs):
    import httpx

    results = []
    with httpx.Client(http1=False, http2=True, trust_env=False, timeout=30) as client:
        for spec in specs:
            started = time.monotonic()
            try:
                body = body_of(spec)
                r = client.request(
                    spec["method"],
                    spec["url"],
                    headers=spec.get("headers") or [],
                    content=body,
                )
                results.append(
                    result(spec, r.status_code, r.http_version, list(r.headers.multi_items()), r.content, started)
                )
            except Exception as e:  # noqa: BLE001 - every failure is a result
                results.append(result(spec, 0, "", [], b"", started, "%s: %s" % (type(e).__name__, e)))
    return results


def main():
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        specs = json.load(f)
    run = {"requests": run_requests, "httpx": run_httpx}[mode]
    json.dump(run(specs), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
