#!/usr/bin/env bash
# User-space instructions per proxied request, counted by callgrind: steadier
# than CPU time on a noisy machine, for comparing two builds of weir.
#
#   bench/callgrind.sh [WEIR_BINARY ...]    # default: target/release/weir
#   SHAPE=h2c bench/callgrind.sh            # an h2c upstream (the fast path, its attempts through the H2 pool)
#   SHAPE=tls bench/callgrind.sh            # an HTTPS upstream, HTTP/1.1 pinned (the fast path)
#   SHAPE=grpc bench/callgrind.sh           # gRPC unary, h2c on both sides (h2load; the general path)
#   SHAPE=h2-in bench/callgrind.sh          # h2c clients in (h2load), an HTTP/1.1 upstream (the general path)
#   SHAPE=post bench/callgrind.sh           # a 1 KiB POST (the fast path)
#   SHAPE=post-keyed bench/callgrind.sh     # the same with a new Idempotency-Key on each (recorded)
#   SHAPE=post64k bench/callgrind.sh        # a 64 KiB POST (the fast path)
#   SHAPE=big bench/callgrind.sh            # a 1 MiB response (the fast path), as bench/shapes.sh's big
#   SHAPE=cache-hit bench/callgrind.sh      # a small GET answered from weir's response cache (fast path)
#   SHAPE=cache-miss bench/callgrind.sh     # the same upstream with the cache on, nothing cacheable
#   KEEP=dir bench/callgrind.sh             # keep the callgrind files for callgrind_annotate
#   TRACING='endpoint = "http://127.0.0.1:4317"
#   sample = 1.0' bench/callgrind.sh        # with a [tracing] table (docs/reference/tracing.md)
#
# For each binary: weir (one worker, every policy on, as in compare.sh) runs
# under `valgrind --tool=callgrind` in front of nginx answering `return 200`,
# once with a 2 s and once with a 6 s `wrk -t1 -c4` run; the figure is the
# slope (instructions at 6 s − at 2 s) / (requests at 6 s − at 2 s), so
# start-up and shutdown cancel out. Needs valgrind, wrk and nginx:
#   apt-get install -y valgrind wrk nginx-light
# Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind wrk nginx; do
    command -v "$tool" >/dev/null || { echo "$tool is required: apt-get install -y valgrind wrk nginx-light" >&2; exit 1; }
done
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
    cargo build --release --locked -q
    BINS=(target/release/weir)
fi
UP_PORT=18090
WEIR_PORT=18091
WEIR_ADMIN=18092

# shellcheck source=bench/lib.sh
source bench/lib.sh
SHAPE=${SHAPE:-small}
start_nginx_upstream $UP_PORT
if [ "$SHAPE" = h2c ] || [ "$SHAPE" = grpc ]; then
    # The same nginx, also answering h2c (prior knowledge) on the next port,
    # gRPC-shaped (grpc-status in trailers) for the grpc shape.
    UP_H2C=$((UP_PORT + 10))
    grpc='location /bench.Bench/ { default_type application/grpc; add_trailer grpc-status 0 always; return 200 \"okokok\"; }'
    sed -i "s|server { listen 127.0.0.1:$UP_PORT;|server { listen 127.0.0.1:$UP_H2C http2; $grpc location / { return 200 \"ok\"; } }\n    server { listen 127.0.0.1:$UP_PORT;|" "$T/up/nginx.conf"
    kill -HUP "${PIDS[-1]}"
    wait_port $UP_H2C
fi
if [ "$SHAPE" = cache-hit ]; then
    # Every answer may be kept for an hour: after the first, weir answers them.
    sed -i 's|location / { return 200 "ok"; }|location / { add_header Cache-Control "max-age=3600" always; return 200 "ok"; }|' "$T/up/nginx.conf"
    kill -HUP "${PIDS[-1]}"
    sleep 0.5
fi
if [ "$SHAPE" = big ]; then
    # A 1 MiB file (nginx's workers do not run as root).
    head -c 1048576 /dev/urandom > "$T/big.bin"
    chmod a+rx "$T"; chmod a+r "$T/big.bin"
    sed -i "s|location / { return 200 \"ok\"; }|location / { root $T; try_files /big.bin =404; }|" "$T/up/nginx.conf"
    kill -HUP "${PIDS[-1]}"
    sleep 0.5
fi
SCHEME=http UP=${UP_H2C:-$UP_PORT}
if [ "$SHAPE" = tls ]; then
    # The same nginx, also answering HTTPS (session tickets on) on the next port.
    UP=$((UP_PORT + 20)) SCHEME=https
    # A CA and a leaf it signed: a self-signed certificate marked CA is
    # refused as a server's own.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=weir bench CA" -keyout "$T/ca.key" -out "$T/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
        -keyout "$T/leaf.key" -out "$T/leaf.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost\n' > "$T/san.ext"
    openssl x509 -req -in "$T/leaf.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
        -days 2 -extfile "$T/san.ext" -out "$T/leaf.pem" 2>/dev/null
    sed -i "s|server { listen 127.0.0.1:$UP_PORT;|server { listen 127.0.0.1:$UP ssl; ssl_certificate $T/leaf.pem; ssl_certificate_key $T/leaf.key; ssl_session_tickets on; location / { return 200 \"ok\"; } }\n    server { listen 127.0.0.1:$UP_PORT;|" "$T/up/nginx.conf"
    kill -HUP "${PIDS[-1]}"
    wait_port $UP
fi

cat > "$T/weir.toml" <<CONF
[server]
listen = "127.0.0.1:$WEIR_PORT"
admin = "127.0.0.1:$WEIR_ADMIN"

[upstreams.bench]
url = "$SCHEME://$([ "$SHAPE" = tls ] && echo localhost || echo 127.0.0.1):$UP"
hosts = ["127.0.0.1", "localhost"]
$(case $SHAPE in h2c | grpc) echo 'protocol = "h2c"' ;; esac)
$([ "$SHAPE" = tls ] && echo 'protocol = "http1"')
$([ "$SHAPE" = tls ] && printf '[upstreams.bench.tls]\nca_file = "%s"' "$T/ca.pem")

$(case $SHAPE in cache-*) printf '[upstreams.bench.cache]\nenabled = true' ;; esac)

[upstreams.bench.retry]
max_attempts = 3
[upstreams.bench.rate_limit]
rps = 10000000.0
burst = 10000000
$([ -z "${TRACING:-}" ] || printf '[tracing]\n%s\n' "$TRACING")
CONF

# One run: weir under callgrind for a wrk run of $2 seconds; prints
# "instructions requests".
run() { # binary seconds
    local out="$T/cg.$2"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$1" --log-level error run --workers 1 --config "$T/weir.toml" 2>/dev/null &
    local pid=$!
    PIDS+=($pid)
    wait_port $WEIR_PORT
    # cache-hit: one read first, so that wrk's connections find the entry
    # fresh (every request a hit, none a miss).
    [ "$SHAPE" != cache-hit ] || curl -s -o /dev/null "http://127.0.0.1:$WEIR_PORT/"
    local reqs
    reqs=$(load "$2")
    kill -INT "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    local ir
    ir=$(awk '/^summary:/ {print $2}' "$out")
    [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP"; cp "$out" "$KEEP/"; }
    echo "$ir $reqs"
}

# The load of one run: SECONDS of it; prints the requests completed, or
# stops the script when weir answered any with an error (a count of weir's
# own errors would be no measure of proxying).
load() { # seconds
    local res
    if [ "$SHAPE" = h2-in ]; then
        res=$(h2load -c4 -m1 -D"$1" "http://127.0.0.1:$WEIR_PORT/")
        echo "$res" | grep -q "status codes: [0-9]* 2xx, 0 3xx, 0 4xx, 0 5xx" || { echo "weir answered errors: $res" >&2; exit 1; }
        echo "$res" | awk '/^requests:/ {print $8}'
        return
    fi
    if [ "$SHAPE" = grpc ]; then
        printf '\0\0\0\0\2\x08\x01' > "$T/grpc.bin"
        res=$(h2load -c4 -m1 -D"$1" -d "$T/grpc.bin" -H 'content-type: application/grpc' \
            -H 'te: trailers' "http://127.0.0.1:$WEIR_PORT/bench.Bench/Unary")
        echo "$res" | grep -q "status codes: [0-9]* 2xx, 0 3xx, 0 4xx, 0 5xx" || { echo "weir answered errors: $res" >&2; exit 1; }
        echo "$res" | awk '/^requests:/ {print $8}'
        return
    fi
    local script=()
    case $SHAPE in
        post) script=(-s bench/shapes/post1k.lua) ;;
        post-keyed) script=(-s bench/shapes/post1k-keyed.lua) ;;
        post64k) script=(-s bench/shapes/post64k.lua) ;;
    esac
    res=$(wrk -t1 -c4 -d"$1"s "${script[@]}" "http://127.0.0.1:$WEIR_PORT/")
    if echo "$res" | grep -q "Non-2xx"; then echo "weir answered errors: $res" >&2; exit 1; fi
    echo "$res" | awk '/requests in/ {print $1}'
}

echo "| build | requests (2 s, 6 s) | instructions per request |"
echo "|---|---|---|"
for b in "${BINS[@]}"; do
    read -r i2 r2 < <(run "$b" 2)
    read -r i6 r6 < <(run "$b" 6)
    per=$(awk -v a="$i2" -v b="$i6" -v x="$r2" -v y="$r6" 'BEGIN { printf "%.0f", (b - a) / (y - x) }')
    echo "| $b | $r2, $r6 | $per |"
done
