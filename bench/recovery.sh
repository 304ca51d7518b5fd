#!/usr/bin/env bash
# Recovery after an outage, side by side: a client paced at 100 requests/s
# for 20 s, straight to the upstream and through weir, nginx, HAProxy (and
# Envoy when $ENVOY or `envoy` is there), each on its defaults for one
# upstream. The upstream (nginx on 127.0.0.2) is stopped at t = 5 s —
# connections refused — and started again at t = 10 s. For each: when the
# first request succeeded after the upstream listened again, from when a
# one-second window of requests was ≥ 95 % successful, the requests answered
# 200, and the attempts the dead upstream could have seen (requests the
# proxy sent while it was down are not countable from outside; weir's own
# `weir chaos recovery` counts them).
#
#   bench/recovery.sh                 # OUTAGE=5 (seconds)
#   OUTAGE=60 RUN=70 bench/recovery.sh
#
# Needs nginx and haproxy (apt-get install -y nginx-light haproxy) and
# python3. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

OUTAGE=${OUTAGE:-5}
RUN=${RUN:-$((OUTAGE + 15))}
ENVOY=${ENVOY:-$(command -v envoy || true)}
WEIR=${WEIR:-target/release/weir}
[ -x "$WEIR" ] || cargo build --release --locked -q
UP=127.0.0.2 UP_PORT=18400
WEIR_PORT=18410 WEIR_ADMIN=18411 NGINX_PORT=18412 HAPROXY_PORT=18413 ENVOY_PORT=18414 ENVOY_ADMIN=18415

nginx_conf "$T/up" 4096 <<CONF
    server { listen $UP:$UP_PORT; location / { return 200 "ok"; } }
CONF
UP_PID=""
up_start() {
    nginx_start "$T/up"
    UP_PID=$!
    for _ in $(seq 1 200); do
        (exec 3<>/dev/tcp/$UP/$UP_PORT) 2>/dev/null && return 0
        sleep 0.01
    done
}
up_stop() { kill "$UP_PID"; wait "$UP_PID" 2>/dev/null || true; }

start_proxy() { # name → ADDR: where the client sends (the upstream itself for none)
    case $1 in
        none) ADDR="$UP:$UP_PORT" ;;
        weir)
            cat > "$T/weir.toml" <<CONF
[server]
listen = "127.0.0.1:$WEIR_PORT"
admin = "127.0.0.1:$WEIR_ADMIN"
access_log = "off"
[upstreams.svc]
url = "http://$UP:$UP_PORT"
hosts = ["127.0.0.1"]
CONF
            "$WEIR" --log-level error run --config "$T/weir.toml" 2>/dev/null &
            PROXY_PID=$!; PIDS+=($PROXY_PID); wait_port $WEIR_PORT >/dev/null
            ADDR="127.0.0.1:$WEIR_PORT" ;;
        nginx)
            nginx_conf "$T/ng" 4096 <<CONF
    upstream svc { server $UP:$UP_PORT; keepalive 64; }
    server { listen 127.0.0.1:$NGINX_PORT; location / {
        proxy_pass http://svc; proxy_http_version 1.1; proxy_set_header Connection "";
        proxy_next_upstream error timeout http_503; proxy_next_upstream_tries 3; } }
CONF
            nginx_start "$T/ng"
            PROXY_PID=$!; wait_port $NGINX_PORT
            ADDR="127.0.0.1:$NGINX_PORT" ;;
        haproxy)
            cat > "$T/haproxy.cfg" <<CONF
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 2
    retry-on conn-failure empty-response 503
frontend f
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend b
backend b
    http-reuse safe
    server s1 $UP:$UP_PORT
CONF
            haproxy -db -f "$T/haproxy.cfg" 2>/dev/null &
            PROXY_PID=$!; PIDS+=($PROXY_PID); wait_port $HAPROXY_PORT
            ADDR="127.0.0.1:$HAPROXY_PORT" ;;
        envoy)
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
                  retry_policy: {retry_on: "5xx,connect-failure,reset", num_retries: 2, per_try_timeout: 0.3s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: svc
    connect_timeout: 1s
    type: STATIC
    load_assignment:
      cluster_name: svc
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: $UP, port_value: $UP_PORT}}}
CONF
            "$ENVOY" -c "$T/envoy.yaml" --log-level critical >/dev/null 2>&1 &
            PROXY_PID=$!; PIDS+=($PROXY_PID); wait_port $ENVOY_PORT
            ADDR="127.0.0.1:$ENVOY_PORT" ;;
    esac
}

cat > "$T/client.py" <<'PY'
import http.client, json, sys, time
host, port = sys.argv[1].split(":")
run, out = float(sys.argv[2]), sys.argv[3]
conn, records, t0, n = None, [], time.monotonic(), 0
while True:
    due = t0 + n * 0.01
    now = time.monotonic()
    if due - t0 >= run:
        break
    if due > now:
        time.sleep(due - now)
    start = time.time()
    ok = False
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, int(port), timeout=1)
        conn.request("GET", "/", headers={"Host": "127.0.0.1"})
        r = conn.getresponse()
        r.read()
        ok = r.status == 200
        if r.getheader("connection", "").lower() == "close":
            conn.close(); conn = None
    except Exception:
        if conn is not None:
            conn.close()
        conn = None
    records.append((start, time.time(), ok))
    n += 1
json.dump(records, open(out, "w"))
PY

cat > "$T/read.py" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
back = float(open(sys.argv[2]).read())
first = min((done for _, done, ok in records if ok and done >= back), default=None)
to95 = None
t = back
last = max(s for s, _, _ in records)
while t + 1 <= last:
    w = [ok for s, _, ok in records if t <= s < t + 1]
    if w and sum(w) * 100 >= 95 * len(w):
        to95 = t - back
        break
    t += 0.05
ok = sum(1 for *_, o in records if o)
f = "-" if first is None else f"{first - back:.3f} s"
g = "-" if to95 is None else f"+{to95:.2f} s"
print(f"| {sys.argv[3]} | {f} | {g} | {ok} of {len(records)} |")
PY

read -r -a proxies <<< "${PROXIES:-none weir nginx haproxy}"
[ -n "$ENVOY" ] && proxies+=(envoy)
echo "### recovery after a ${OUTAGE} s outage ($(date +%F), 100 requests/s for ${RUN} s, refused from 5 s)"
echo
echo "| proxy | first success after the upstream is back | ≥ 95 % from | answered 200 |"
echo "|---|---|---|---|"
for p in "${proxies[@]}"; do
    up_start
    start_proxy "$p"
    sleep 0.5
    python3 "$T/client.py" "$ADDR" "$RUN" "$T/$p.json" &
    client=$!
    sleep 5
    up_stop
    sleep "$OUTAGE"
    up_start
    date +%s.%N > "$T/$p.back"   # wall clock, as the client's records
    wait "$client"
    python3 "$T/read.py" "$T/$p.json" "$T/$p.back" "$p"
    up_stop
    [ "$p" = none ] || { kill "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null || true; }
done
