#!/usr/bin/env bash
# What the response cache costs and saves, in weir's CPU time per request:
# three weirs side by side in front of one nginx, runs interleaved, medians.
#
#   forward    a small GET, cache off (the fast path)
#   hit        the same GET answered from a fresh entry (the cache warmed
#              first, so wrk's connections stay on the fast path)
#   hit-cold   the same, on connections that began with a miss (before
#              51d6c7c a miss moved its connection to hyper's path for good)
#   miss       the cache on, nothing cacheable: every GET goes upstream,
#              looked up and checked for storing (the fast path since
#              51d6c7c; hyper's path before)
#
#   ROUNDS=7 DUR=3 bench/cache.sh [WEIR_BINARY]    # default: target/release/weir
# Needs wrk, nginx and curl. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
WEIR=${1:-}
if [ -z "$WEIR" ]; then
    cargo build --release --locked -q
    WEIR=target/release/weir
fi
# shellcheck source=bench/lib.sh
source bench/lib.sh
UP=18290 UP_CACHED=18293
start_nginx_upstream $UP
# A second server whose answers may be kept for an hour.
sed -i "s|server { listen 127.0.0.1:$UP;|server { listen 127.0.0.1:$UP_CACHED; location / { add_header Cache-Control \"max-age=3600\" always; return 200 \"ok\"; } }\n    server { listen 127.0.0.1:$UP;|" "$T/up/nginx.conf"
kill -HUP "${PIDS[-1]}"
wait_port $UP_CACHED
declare -A PID PORT
start() { # name port upstream-port cache(on|off)
    cat > "$T/$1.toml" <<CONF
[server]
listen = "127.0.0.1:$2"
admin = "127.0.0.1:$(($2 + 1))"
[upstreams.bench]
url = "http://127.0.0.1:$3"
hosts = ["127.0.0.1", "localhost"]
$([ "$4" = on ] && printf '[upstreams.bench.cache]\nenabled = true')
CONF
    "$WEIR" --log-level error run --workers 1 --config "$T/$1.toml" &
    PIDS+=($!)
    PID[$1]=$!
    PORT[$1]=$2
    wait_port "$2"
}
start forward 18300 $UP off
start hit 18310 $UP_CACHED on
start hit-cold 18320 $UP_CACHED on
start miss 18330 $UP on
curl -s -o /dev/null "http://127.0.0.1:18310/"
# One run of NAME: weir's CPU µs per request.
run() {
    local pid=${PID[$1]} a b r
    a=$(cpu_ticks "$pid")
    r=$(wrk -t1 -c4 -d"${DUR:-3}"s "http://127.0.0.1:${PORT[$1]}/" | awk '/requests in/ {print $1}')
    b=$(cpu_ticks "$pid")
    awk -v a="$a" -v b="$b" -v r="$r" -v t="$tck" 'BEGIN { printf "%.2f", (b - a) * 1e6 / t / r }'
}
# hit-cold: restart it cold before each run, so every wrk connection's
# first read is a miss.
cold() {
    kill "${PID[hit-cold]}"
    wait "${PID[hit-cold]}" 2>/dev/null || true
    start hit-cold 18320 $UP_CACHED on
}
declare -A all
names=(forward hit hit-cold miss)
for i in $(seq 1 "${ROUNDS:-7}"); do
    line="round $i:"
    for n in "${names[@]}"; do
        [ "$n" != hit-cold ] || cold
        v=$(run "$n")
        all[$n]+="$v "
        line+=" $n $v"
    done
    echo "$line"
done
echo
echo "| request | weir CPU µs/request (median of ${ROUNDS:-7}) | ÷ forward |"
echo "|---|---|---|"
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
f=$(echo "${all[forward]}" | median)
for n in "${names[@]}"; do
    m=$(echo "${all[$n]}" | median)
    echo "| $n | $m | $(awk -v m="$m" -v f="$f" 'BEGIN { printf "%.2f", m / f }') |"
done
