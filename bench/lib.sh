# Shared by bench/compare.sh and bench/callgrind.sh (sourced, not run):
# a temp dir $T, processes started by PID in PIDS and stopped on exit,
# waiting for a port, and nginx as the upstream answering `return 200 "ok"`.

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

# nginx on 127.0.0.1:PORT answering `return 200 "ok"`, run with the
# optional command prefix (e.g. CPU pinning): start_nginx_upstream PORT [PREFIX...]
start_nginx_upstream() {
    local port=$1
    shift
    mkdir -p "$T/up/logs"
    cat > "$T/up/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $T/up/nginx.pid;
error_log $T/up/logs/error.log crit;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $T/up; proxy_temp_path $T/up; fastcgi_temp_path $T/up;
    uwsgi_temp_path $T/up; scgi_temp_path $T/up;
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$port; location / { return 200 "ok"; } }
}
CONF
    "$@" nginx -p "$T/up" -c "$T/up/nginx.conf" -e "$T/up/logs/error.log" &
    PIDS+=($!)
    wait_port "$port"
}
