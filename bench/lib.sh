# Shared by the bench/ scripts (sourced, not run): a temp dir $T, processes
# started by PID in PIDS and stopped on exit, waiting for a port, nginx's
# config preamble and start line, nginx as the upstream answering
# `return 200 "ok"`, measuring helpers and HAProxy's config.

T="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    sleep 0.3
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$T"
}
trap cleanup EXIT

wait_port() {
    for _ in $(seq 1 200); do
        (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 did not open" >&2
    return 1
}

# DIR/nginx.conf: the preamble every bench nginx shares (one worker in the
# foreground; pid, error log and temp files under DIR; no access log) around
# BODY, the rest of the http block read from stdin. MAIN_DIRECTIVEs (e.g.
# "master_process off;") go in the main context. Creates DIR/logs.
#   nginx_conf DIR WORKER_CONNECTIONS [MAIN_DIRECTIVE...] <<CONF ... CONF
nginx_conf() {
    local dir=$1 conns=$2
    shift 2
    mkdir -p "$dir/logs"
    {
        echo "worker_processes 1;"
        echo "daemon off;"
        [ $# = 0 ] || printf '%s\n' "$@"
        cat <<CONF
pid $dir/nginx.pid;
error_log $dir/logs/error.log crit;
events { worker_connections $conns; }
http {
    access_log off;
    client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir;
    uwsgi_temp_path $dir; scgi_temp_path $dir;
CONF
        cat
        echo "}"
    } > "$dir/nginx.conf"
}

# nginx on DIR/nginx.conf (as nginx_conf writes it) in the background, run
# with the optional command prefix (e.g. CPU pinning), its pid added to PIDS
# and left in $!: nginx_start DIR [PREFIX...]
nginx_start() {
    local dir=$1
    shift
    "$@" nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log" &
    PIDS+=($!)
}

# nginx on 127.0.0.1:PORT answering `return 200 "ok"`, run with the
# optional command prefix (e.g. CPU pinning): start_nginx_upstream PORT [PREFIX...]
# (bench/cache.sh and bench/callgrind*.sh add servers to $T/up/nginx.conf by
# editing the `server { listen 127.0.0.1:PORT;` line: keep it as it is.)
start_nginx_upstream() {
    local port=$1
    shift
    nginx_conf "$T/up" 4096 <<CONF
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$port; location / { return 200 "ok"; } }
CONF
    nginx_start "$T/up" "$@"
    wait_port "$port"
}

# ---- measuring (bench/compare.sh, bench/shapes.sh) ----------------------------
tck=$(getconf CLK_TCK)
family() { # pid and its children
    echo "$1"; pgrep -P "$1" 2>/dev/null || true
}
cpu_ticks() { # summed utime+stime of a process and its children
    local sum=0
    for p in $(family "$1"); do
        [ -r /proc/$p/stat ] || continue
        # fields after the ")" of the command name: utime is 12th, stime 13th
        local f; f=$(sed 's/^.*) //' /proc/$p/stat)
        set -- $f
        sum=$((sum + ${12} + ${13}))
    done
    echo $sum
}
peak_rss_kib() {
    local sum=0
    for p in $(family "$1"); do
        local v; v=$(awk '/^VmHWM/ {print $2}' /proc/$p/status 2>/dev/null || echo 0)
        sum=$((sum + ${v:-0}))
    done
    echo $sum
}
to_ms() { # wrk latency (e.g. 412.00us, 1.20ms, 2.00s) → ms
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
        else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
        else printf "%s", v }'
}
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# HAProxy as the peer both benches compare: one thread, keep-alive, upstream
# connections reused; listening on $HAPROXY_PORT (with BIND_OPTIONS, e.g.
# `proto h2`). haproxy_config SERVER_LINE [BIND_OPTIONS]
haproxy_config() {
    cat <<CONF
global
    nbthread 1
    maxconn 5000
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
frontend f
    bind 127.0.0.1:$HAPROXY_PORT ${2:-}
    default_backend b
backend b
    http-reuse always
    $1
CONF
}
