#!/usr/bin/env bash
# Instructions per request counted by callgrind for weir AND its peers, the
# same way bench/callgrind.sh counts weir's: each proxy (one worker / one
# thread) runs under `valgrind --tool=callgrind` in front of nginx (not under
# valgrind), once for a SHORT (2 s) and once for a LONG (6 s) load, and the
# figure is the slope (instructions LONG − SHORT) / (requests LONG − SHORT).
#
#   bench/callgrind-peers.sh [WEIR_BINARY]      # default: target/release/weir (built)
#   SHAPES="small h2c grpc h2-in" PROXIES="weir haproxy nginx" CONNS=4 \
#   KEEP=dir SYSCALLS=1 bench/callgrind-peers.sh /tmp/weir
#
# Shapes (configured as bench/shapes.sh configures each proxy for them):
#   small  HTTP/1.1 GET in (wrk), HTTP/1.1 upstream
#   h2c    HTTP/1.1 GET in (wrk), h2c upstream      (nginx cannot: not measured)
#   grpc   gRPC unary, h2c both sides (h2load)      (nginx: listen http2 + grpc_pass)
#   h2-in  h2c GET in (h2load -m1), HTTP/1.1 upstream
# Load: wrk -t1 -c$CONNS or h2load -c$CONNS -m1 (CONNS=4 as in callgrind.sh).
#
# KEEP=dir keeps each callgrind file ($shape.$proxy.{short,long}.cg) and writes
# $shape.$proxy.groups.md: self cost per request by crate/function prefix,
# by source crate, and the top functions (bench/cg-groups.py).
#
# CALLGRIND=0 skips the callgrind pass. SYSCALLS=1 (default) adds a pass
# without valgrind, pinned as bench/shapes.sh pins (proxy and upstream on
# CPU 1, load on CPU 0) with SYSCALL_CONNS (32, as shapes.sh) connections:
# system calls per request counted by `perf stat -e raw_syscalls:sys_enter,...`
# on the proxy's PID, and the proxy's user and system CPU µs per request from
# /proc/PID/task/*/stat — kernel time, which callgrind does not see. A few
# non-2xx answers there are reported and not counted.
#
# Needs valgrind, wrk, h2load, nginx, haproxy, python3 (and perf for SYSCALLS):
#   apt-get install -y valgrind wrk nghttp2-client nginx-light haproxy linux-perf
# Ports 18190-18195. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind wrk h2load nginx haproxy python3; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done
if [ $# -gt 0 ]; then
    WEIR=$1
else
    cargo build --release --locked -q
    WEIR=target/release/weir
fi
SHAPES=${SHAPES:-"small h2c grpc h2-in"}
PROXIES=${PROXIES:-"weir haproxy nginx"}
CONNS=${CONNS:-4}
SHORT=${SHORT:-2}
LONG=${LONG:-6}
CALLGRIND=${CALLGRIND:-1}
SYSCALLS=${SYSCALLS:-1}
SYSCALL_CONNS=${SYSCALL_CONNS:-32}
SYSCALL_SECS=${SYSCALL_SECS:-4}
UP_PORT=18190 UP_H2C_PORT=18191 WEIR_PORT=18192 WEIR_ADMIN=18193 HAPROXY_PORT=18194 NGINX_PORT=18195

# shellcheck source=bench/lib.sh
source bench/lib.sh
[ -z "${KEEP:-}" ] || mkdir -p "$KEEP"

# ---- the upstream: nginx (not under valgrind), HTTP/1.1 and h2c -------------
pin_load="" pin_proxy=""
if [ "$SYSCALLS" = 1 ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    pin_load="taskset -c 0" pin_proxy="taskset -c 1"
fi
# shellcheck disable=SC2086
start_nginx_upstream $UP_PORT $pin_proxy
grpc='location /bench.Bench/ { default_type application/grpc; add_trailer grpc-status 0 always; return 200 \"okokok\"; }'
sed -i "s|server { listen 127.0.0.1:$UP_PORT;|server { listen 127.0.0.1:$UP_H2C_PORT http2; $grpc location / { return 200 \"ok\"; } }\n    server { listen 127.0.0.1:$UP_PORT;|" "$T/up/nginx.conf"
kill -HUP "${PIDS[-1]}"
wait_port $UP_H2C_PORT
printf '\0\0\0\0\2\x08\x01' > "$T/grpc.bin"

# ---- each proxy's configuration for a shape (as bench/shapes.sh) --------------
configure() { # proxy shape → writes its config; prints its port, or nothing if it cannot
    local proxy=$1 shape=$2
    case $proxy in
        weir)
            {
                printf '[server]\nlisten = "127.0.0.1:%s"\nadmin = "127.0.0.1:%s"\nmax_connections = 20000\n\n' $WEIR_PORT $WEIR_ADMIN
                case $shape in
                    h2c | grpc) printf '[upstreams.bench]\nurl = "http://127.0.0.1:%s"\nprotocol = "h2c"\n' $UP_H2C_PORT ;;
                    *) printf '[upstreams.bench]\nurl = "http://127.0.0.1:%s"\n' $UP_PORT ;;
                esac
                printf 'hosts = ["127.0.0.1", "localhost"]\n'
                printf '[upstreams.bench.retry]\nmax_attempts = 3\n'
                printf '[upstreams.bench.rate_limit]\nrps = 10000000.0\nburst = 10000000\n'
            } > "$T/weir.toml"
            echo $WEIR_PORT
            ;;
        haproxy)
            local server="server s1 127.0.0.1:$UP_PORT" bind=""
            case $shape in
                h2c) server="server s1 127.0.0.1:$UP_H2C_PORT proto h2" ;;
                grpc) server="server s1 127.0.0.1:$UP_H2C_PORT proto h2" bind="proto h2" ;;
                h2-in) bind="proto h2" ;;
            esac
            haproxy_config "$server" "$bind" > "$T/haproxy.cfg"
            echo $HAPROXY_PORT
            ;;
        nginx)
            [ "$shape" != h2c ] || return 0 # proxy_pass speaks HTTP/1.x only
            local up=$UP_PORT listen="" location="proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";"
            case $shape in
                grpc) up=$UP_H2C_PORT listen=http2 location="grpc_pass grpc://up;" ;;
                h2-in) listen=http2 ;;
            esac
            nginx_conf "$T/nx" 4096 "master_process off;" <<CONF
    keepalive_requests 1000000;
    client_max_body_size 0;
    client_body_buffer_size 128k;
    proxy_buffers 16 64k;
    upstream up { server 127.0.0.1:$up; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$NGINX_PORT $listen;
        location / { $location }
    }
CONF
            echo $NGINX_PORT
            ;;
    esac
}

command_of() { # proxy → its command line (one worker, foreground)
    case $1 in
        weir) echo "$WEIR --log-level error run --workers 1 --config $T/weir.toml" ;;
        haproxy) echo "haproxy -db -f $T/haproxy.cfg" ;;
        nginx) echo "nginx -p $T/nx -c $T/nx/nginx.conf -e $T/nx/logs/error.log" ;;
    esac
}

# ---- load: prints the requests answered 2xx; stops the script on any other
# answer, or with TOLERANT=1 (the system-call pass) only says how many ------
load() { # shape port seconds conns [prefix...]
    local shape=$1 port=$2 secs=$3 conns=$4 res bad
    shift 4
    case $shape in
        grpc | h2-in)
            if [ "$shape" = grpc ]; then
                res=$("$@" h2load -c"$conns" -m1 -D"$secs" -d "$T/grpc.bin" -H 'content-type: application/grpc' \
                    -H 'te: trailers' "http://127.0.0.1:$port/bench.Bench/Unary")
            else
                res=$("$@" h2load -c"$conns" -m1 -D"$secs" "http://127.0.0.1:$port/")
            fi
            if ! echo "$res" | grep -q "status codes: [0-9]* 2xx, 0 3xx, 0 4xx, 0 5xx"; then
                bad=$(echo "$res" | grep "^status codes:")
                [ "${TOLERANT:-0}" = 1 ] || { echo "errors on $port: $res" >&2; exit 1; }
                echo "$shape on port $port, not all 2xx (not counted): $bad" >&2
            fi
            echo "$res" | awk '/^status codes:/ {print $3}'
            ;;
        *)
            res=$("$@" wrk -t1 -c"$conns" -d"$secs"s "http://127.0.0.1:$port/")
            bad=$(echo "$res" | awk '/Non-2xx/ {print $NF}')
            if [ -n "$bad" ]; then
                [ "${TOLERANT:-0}" = 1 ] || { echo "errors on $port: $res" >&2; exit 1; }
                echo "$shape on port $port: $bad non-2xx answers (not counted)" >&2
            fi
            echo "$res" | awk -v bad="${bad:-0}" '/requests in/ {print $1 - bad}'
            ;;
    esac
}

stop() { # pid signal: signal it and wait for it to exit
    kill "-$2" "$1" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$1" 2>/dev/null && { echo "pid $1 did not exit" >&2; kill -9 "$1"; }
    wait "$1" 2>/dev/null || true
}
signal_of() { case $1 in weir) echo INT ;; *) echo TERM ;; esac; }

# One callgrind run: sets IR (instructions) and REQS (requests). Not run in a
# subshell, so that the cleanup on exit knows every PID.
cg_run() { # proxy shape port seconds
    local proxy=$1 shape=$2 port=$3 secs=$4 out="$T/cg.$1.$2.$4" pid
    # shellcheck disable=SC2046
    valgrind --tool=callgrind --callgrind-out-file="$out" $(command_of "$proxy") >"$T/vg.log" 2>&1 &
    pid=$!
    PIDS+=($pid)
    wait_port "$port"
    REQS=$(load "$shape" "$port" "$secs" "$CONNS")
    stop "$pid" "$(signal_of "$proxy")"
    IR=$(awk '/^summary:/ {print $2}' "$out")
    [ -n "$IR" ] || { echo "no callgrind summary for $proxy/$shape:" >&2; cat "$T/vg.log" >&2; exit 1; }
}

# One pass without valgrind: sets SYS to "syscalls/req|user-µs/req|sys-µs/req|top-syscalls".
EVENTS="raw_syscalls:sys_enter"
for s in read write readv writev recvfrom sendto recvmsg sendmsg epoll_wait epoll_pwait epoll_ctl futex sched_yield splice; do
    [ -d "/sys/kernel/tracing/events/syscalls/sys_enter_$s" ] && EVENTS="$EVENTS,syscalls:sys_enter_$s"
done
ticks() { # pid → "utime stime" summed over its threads
    local u=0 s=0 f
    for task in /proc/"$1"/task/*; do
        f=$(sed 's/^.*) //' "$task/stat" 2>/dev/null) || continue
        # shellcheck disable=SC2086
        set -- $f
        u=$((u + ${12})) s=$((s + ${13}))
    done
    echo "$u $s"
}
sys_run() { # proxy shape port
    local proxy=$1 shape=$2 port=$3 pid perf reqs u0 s0 u1 s1
    # shellcheck disable=SC2046
    $pin_proxy $(command_of "$proxy") >/dev/null 2>&1 &
    pid=$!
    PIDS+=($pid)
    wait_port "$port"
    # shellcheck disable=SC2086
    TOLERANT=1 load "$shape" "$port" 1 "$SYSCALL_CONNS" $pin_load >/dev/null # warm-up
    perf stat -x, -e "$EVENTS" -p "$pid" -o "$T/perf.out" &
    perf=$!
    PIDS+=($perf)
    sleep 0.5
    read -r u0 s0 < <(ticks "$pid")
    # shellcheck disable=SC2086
    reqs=$(TOLERANT=1 load "$shape" "$port" "$SYSCALL_SECS" "$SYSCALL_CONNS" $pin_load)
    read -r u1 s1 < <(ticks "$pid")
    stop "$perf" INT
    stop "$pid" "$(signal_of "$proxy")"
    SYS=$(awk -F, -v n="$reqs" -v du=$((u1 - u0)) -v ds=$((s1 - s0)) -v hz="$tck" '
        $3 == "raw_syscalls:sys_enter" { total = $1; next }
        $3 ~ /^syscalls:sys_enter_/ && $1 + 0 > 0 { sub(/^syscalls:sys_enter_/, "", $3); c[$3] = $1 }
        END {
            top = ""
            for (k in c) if (c[k] / n >= 0.05) top = top sprintf("%s %.2f, ", k, c[k] / n)
            sub(/, $/, "", top)
            printf "%.2f|%.1f|%.1f|%s\n", total / n, du / hz * 1e6 / n, ds / hz * 1e6 / n, top
        }' "$T/perf.out")
}

declare -A PER
if [ "$CALLGRIND" = 1 ]; then
echo "$(date -u +%Y-%m-%d), $(nproc) CPUs, callgrind slope over ${SHORT} s and ${LONG} s, $CONNS connections; weir $WEIR"
echo
echo "| shape | proxy | requests (${SHORT} s, ${LONG} s) | instructions per request | vs HAProxy |"
echo "|---|---|---|---|---|"
for shape in $SHAPES; do
    for proxy in $PROXIES; do
        port=$(configure "$proxy" "$shape")
        [ -n "$port" ] || { echo "| $shape | $proxy | — | not measured (cannot proxy this shape) | |"; continue; }
        cg_run "$proxy" "$shape" "$port" "$SHORT"
        i1=$IR r1=$REQS
        cg_run "$proxy" "$shape" "$port" "$LONG"
        i2=$IR r2=$REQS
        per=$(awk -v a="$i1" -v b="$i2" -v x="$r1" -v y="$r2" 'BEGIN { printf "%.0f", (b - a) / (y - x) }')
        PER[$shape.$proxy]=$per
        ratio=""
        [ -z "${PER[$shape.haproxy]:-}" ] || ratio=$(awk -v a="$per" -v b="${PER[$shape.haproxy]}" 'BEGIN { printf "%.2fx", a / b }')
        echo "| $shape | $proxy | $r1, $r2 | $per | $ratio |"
        if [ -n "${KEEP:-}" ]; then
            cp "$T/cg.$proxy.$shape.$SHORT" "$KEEP/$shape.$proxy.short.cg"
            cp "$T/cg.$proxy.$shape.$LONG" "$KEEP/$shape.$proxy.long.cg"
            python3 bench/cg-groups.py "$KEEP/$shape.$proxy.short.cg" "$KEEP/$shape.$proxy.long.cg" \
                $((r2 - r1)) 10 > "$KEEP/$shape.$proxy.groups.md"
        fi
    done
done
# weir's ratio is printed before HAProxy is measured: here against all.
echo
echo "| shape | weir / HAProxy | weir / nginx |"
echo "|---|---|---|"
for shape in $SHAPES; do
    w=${PER[$shape.weir]:-} h=${PER[$shape.haproxy]:-} n=${PER[$shape.nginx]:-}
    printf '| %s | %s | %s |\n' "$shape" \
        "$([ -n "$w" ] && [ -n "$h" ] && awk -v a="$w" -v b="$h" 'BEGIN { printf "%.2fx", a / b }' || echo —)" \
        "$([ -n "$w" ] && [ -n "$n" ] && awk -v a="$w" -v b="$n" 'BEGIN { printf "%.2fx", a / b }' || echo —)"
done

fi

[ "$SYSCALLS" = 1 ] || exit 0
command -v perf >/dev/null || { echo "perf not found: no system-call pass" >&2; exit 0; }
echo
echo "System calls per request (no valgrind; perf stat on the proxy's PID, ${SYSCALL_SECS} s, $SYSCALL_CONNS connections, pinned as shapes.sh):"
echo
echo "| shape | proxy | syscalls per request | user µs/req | sys µs/req | by call (≥ 0.05 per request) |"
echo "|---|---|---|---|---|---|"
for shape in $SHAPES; do
    for proxy in $PROXIES; do
        port=$(configure "$proxy" "$shape")
        [ -n "$port" ] || continue
        sys_run "$proxy" "$shape" "$port"
        IFS='|' read -r n u s top <<<"$SYS"
        echo "| $shape | $proxy | $n | $u | $s | $top |"
    done
done
