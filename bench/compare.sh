#!/usr/bin/env bash
# weir against nginx and HAProxy as the reverse proxy in front of one upstream.
#
#   bench/compare.sh                      # 5 alternating rounds of 10 s each
#   ROUNDS=3 DURATION=5 CONNS=32 bench/compare.sh
#   WEIR_BASELINE=/path/to/older/weir bench/compare.sh   # adds "weir-baseline"
#   OPEN_LOOP=0 bench/compare.sh      # skip the open-loop latency phase (needs `cargo install oha`)
#
# Needs wrk; nginx and HAProxy are compared when installed:
#   apt-get install -y wrk nginx-light haproxy
#
# The upstream is nginx answering `return 200 "ok"` (or, without nginx,
# `weir chaos upstream` with no faults). wrk runs pinned to CPU 0; the proxy
# under test and the upstream share CPU 1, so requests/s ≈ 1 / (proxy +
# upstream CPU per request). weir runs with retries, the retry budget, the
# breaker, a rate limit too high to trigger, and metrics all on; a second
# weir run ("weir, policy off") turns every policy off. For each target the
# script prints the medians over the rounds of: requests/s, p50 and p99
# latency (wrk), peak RSS (VmHWM) and proxy CPU µs per request (utime+stime
# from /proc/PID/stat, master and workers summed). Everything it starts it
# stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
CONNS=${CONNS:-32}
WORKERS=${WORKERS:-1}
UP_PORT=18080
WEIR_PORT=18001
WEIR_ADMIN=18000
NGINX_PORT=18002
HAPROXY_PORT=18003
WEIR_OFF_PORT=18004
WEIR_OFF_ADMIN=18005
WEIR_NAME_PORT=18008
WEIR_NAME_ADMIN=18009
WEIR_BASE_PORT=18006
WEIR_BASE_ADMIN=18007

command -v wrk >/dev/null || { echo "wrk is required: apt-get install -y wrk nginx-light haproxy" >&2; exit 1; }
have_nginx=0; command -v nginx >/dev/null && have_nginx=1
have_haproxy=0; command -v haproxy >/dev/null && have_haproxy=1
pin_load="taskset -c 0"
pin_proxy="taskset -c 1"
if [ "$(nproc)" -lt 2 ] || ! command -v taskset >/dev/null; then
    pin_load=""; pin_proxy=""
    echo "note: fewer than 2 CPUs or no taskset: running unpinned" >&2
fi

cargo build --release --locked -q
WEIR=target/release/weir

# shellcheck source=bench/lib.sh
source bench/lib.sh

# ---- the upstream -----------------------------------------------------------
if [ $have_nginx = 1 ]; then
    start_nginx_upstream $UP_PORT $pin_proxy
else
    $pin_proxy "$WEIR" --log-level error chaos upstream --listen 127.0.0.1:$UP_PORT --profile transient-5 --fail-rate 0 --latency none &
    PIDS+=($!)
    wait_port $UP_PORT
fi

# ---- the proxies ------------------------------------------------------------
weir_config() { # port admin policy(on|off) [upstream host]
    cat <<CONF
[server]
listen = "127.0.0.1:$1"
admin = "127.0.0.1:$2"
max_connections = 20000

[upstreams.bench]
url = "http://${4:-127.0.0.1}:$UP_PORT"
hosts = ["127.0.0.1", "localhost"]
CONF
    if [ "$3" = on ]; then
        cat <<CONF
[upstreams.bench.retry]
max_attempts = 3
[upstreams.bench.rate_limit]
rps = 10000000.0
burst = 10000000
CONF
    else
        cat <<CONF
[upstreams.bench.retry]
max_attempts = 1
[upstreams.bench.breaker]
enabled = false
[upstreams.bench.concurrency]
max_in_flight = 1000000
CONF
    fi
}

declare -A PID_OF PORT_OF
targets=()

start_weir() { # name port admin policy [binary] [upstream host]
    weir_config "$2" "$3" "$4" "${6:-}" > "$T/$1.toml"
    $pin_proxy "${5:-$WEIR}" --log-level error run --workers "$WORKERS" --config "$T/$1.toml" &
    PID_OF[$1]=$!; PORT_OF[$1]=$2; PIDS+=($!)
    wait_port "$2"
    targets+=("$1")
}
start_weir weir $WEIR_PORT $WEIR_ADMIN on
start_weir weir-policy-off $WEIR_OFF_PORT $WEIR_OFF_ADMIN off
# The same upstream named by DNS (`localhost`), as real sidecar configs
# write it: resolved in the background, the fast path all the same.
start_weir weir-by-name $WEIR_NAME_PORT $WEIR_NAME_ADMIN on "" localhost
# Another build of weir, same config as "weir": a before/after comparison
# in one run, the rounds alternating, so the machine's noise hits both.
if [ -n "${WEIR_BASELINE:-}" ]; then
    start_weir weir-baseline $WEIR_BASE_PORT $WEIR_BASE_ADMIN on "$WEIR_BASELINE"
fi

if [ $have_nginx = 1 ]; then
    nginx_conf "$T/nx" 20000 <<CONF
    keepalive_requests 1000000;
    upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
CONF
    # shellcheck disable=SC2086
    nginx_start "$T/nx" $pin_proxy
    PID_OF[nginx]=$!; PORT_OF[nginx]=$NGINX_PORT
    wait_port $NGINX_PORT
    targets+=(nginx)
fi

if [ $have_haproxy = 1 ]; then
    haproxy_config "server s1 127.0.0.1:$UP_PORT" > "$T/haproxy.cfg"
    $pin_proxy haproxy -db -f "$T/haproxy.cfg" &
    PID_OF[haproxy]=$!; PORT_OF[haproxy]=$HAPROXY_PORT; PIDS+=($!)
    wait_port $HAPROXY_PORT
    targets+=(haproxy)
fi

# ---- measuring -------------------------------------------------------------
# Measuring helpers (tck, cpu_ticks, peak_rss_kib, to_ms, median): bench/lib.sh.

echo "warming up…" >&2
for t in "${targets[@]}"; do
    $pin_load wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:${PORT_OF[$t]}/" >/dev/null
done

for r in $(seq 1 "$ROUNDS"); do
    for t in "${targets[@]}"; do
        pid=${PID_OF[$t]}
        before=$(cpu_ticks "$pid")
        out=$($pin_load wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:${PORT_OF[$t]}/")
        after=$(cpu_ticks "$pid")
        reqs=$(echo "$out" | awk '/requests in/ {print $1}')
        rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
        p50=$(to_ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")
        p99=$(to_ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
        errors=$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr '\n' ' ')
        cpu_us=$(awk -v t=$((after - before)) -v hz="$tck" -v n="$reqs" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
        echo "$rps $p50 $p99 $cpu_us" >> "$T/$t.samples"
        printf 'round %d %-16s %10s req/s  p50 %7s ms  p99 %7s ms  cpu %6s µs/req %s\n' \
            "$r" "$t" "$rps" "$p50" "$p99" "$cpu_us" "$errors" >&2
    done
done

echo
echo "$(date -u +%Y-%m-%d), $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), wrk -t1 -c$CONNS -d${DURATION}s × $ROUNDS rounds, medians"
echo
echo "| target | requests/s | p50 ms | p99 ms | peak RSS MiB | proxy CPU µs/request |"
echo "|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
    f="$T/$t.samples"
    rps=$(awk '{print $1}' "$f" | median)
    p50=$(awk '{print $2}' "$f" | median)
    p99=$(awk '{print $3}' "$f" | median)
    cpu=$(awk '{print $4}' "$f" | median)
    rss=$(awk -v k="$(peak_rss_kib "${PID_OF[$t]}")" 'BEGIN { printf "%.1f", k / 1024 }')
    echo "| $t | $rps | $p50 | $p99 | $rss | $cpu |"
done

# ---- latency added, open loop -----------------------------------------------
# A closed loop's p99 mostly measures queueing. Here every target, and the
# upstream on its own ("direct"), gets the same fixed rate — half the slowest
# peer's capacity above — from oha (`cargo install oha`), whose latency
# correction counts a request from when it was due, not when it was sent.
# OPEN_LOOP=0 skips it.
if [ "${OPEN_LOOP:-1}" = 1 ] && command -v oha >/dev/null; then
    peers=""
    for t in nginx haproxy; do [ -f "$T/$t.samples" ] && peers="$peers $t"; done
    [ -n "$peers" ] || peers=" weir"
    slowest=$(for t in $peers; do awk '{print $1}' "$T/$t.samples" | median; done | sort -g | head -1)
    rate=$(awk -v r="$slowest" 'BEGIN { printf "%d", r / 2 }')
    echo
    echo "Open loop: $rate requests/s (half the slowest peer's closed-loop rate), oha -c $CONNS -z ${DURATION}s --latency-correction × $ROUNDS rounds, medians; added = target − direct"
    echo
    echo "| target | p50 ms | p99 ms | p99.9 ms | added p99 ms | added p99.9 ms |"
    echo "|---|---|---|---|---|---|"
    PORT_OF[direct]=$UP_PORT
    for r in $(seq 1 "$ROUNDS"); do
        for t in direct "${targets[@]}"; do
            $pin_load oha -z "${DURATION}s" -q "$rate" -c "$CONNS" --latency-correction --no-tui \
                --output-format json "http://127.0.0.1:${PORT_OF[$t]}/" 2>/dev/null \
                | python3 -c 'import json,sys; p=json.load(sys.stdin)["latencyPercentiles"]; print("%.3f %.3f %.3f" % (p["p50"]*1e3, p["p99"]*1e3, p["p99.9"]*1e3))' \
                >> "$T/$t.open"
        done
    done
    col() { awk -v c="$2" '{print $c}' "$T/$1.open" | median; }
    d99=$(col direct 2); d999=$(col direct 3)
    for t in direct "${targets[@]}"; do
        p50=$(col "$t" 1); p99=$(col "$t" 2); p999=$(col "$t" 3)
        echo "| $t | $p50 | $p99 | $p999 | $(awk -v a="$p99" -v b="$d99" 'BEGIN { printf "%.3f", a - b }') | $(awk -v a="$p999" -v b="$d999" 'BEGIN { printf "%.3f", a - b }') |"
    done
fi
