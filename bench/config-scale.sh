#!/usr/bin/env bash
# What a config of N upstreams costs weir (issue 57): `weir check`'s time,
# the time until a started weir answers /readyz, a reload's time (POST
# /reload, with one upstream's rate changed), idle RSS, and the /metrics
# lines of an idle weir. Each upstream has retries and a rate limit, as in
# the issue's table.
#
#   bench/config-scale.sh [WEIR_BINARY] [N ...]     # default: target/release/weir 1000 5000
#
# Medians of 3 rounds. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/weir}
shift || true
SIZES=("$@")
[ ${#SIZES[@]} -eq 0 ] && SIZES=(1000 5000)
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
ADMIN=18193

config() { # N RPS
    python3 - "$1" "$2" > "$DIR/weir.toml" <<'PY'
import sys
n, rps = int(sys.argv[1]), sys.argv[2]
print('[server]\nlisten = "127.0.0.1:18192"\nadmin = "127.0.0.1:18193"\n')
for i in range(n):
    print(f'[upstreams.u{i}]\nurl = "http://10.{(i>>8)&255}.{i&255}.1:8080"\nhosts = ["u{i}.internal"]')
    print(f'[upstreams.u{i}.retry]\nmax_attempts = 3')
    print(f'[upstreams.u{i}.rate_limit]\nrps = {rps if i == 0 else 100}\n')
PY
}
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '| upstreams | `weir check` | ready | reload | RSS idle | `/metrics` lines |\n|---|---|---|---|---|---|\n'
for n in "${SIZES[@]}"; do
    checks=(); readys=(); reloads=(); rss=(); lines=0
    for round in 1 2 3; do
        config "$n" 100
        t0=$(now); "$BIN" check --config "$DIR/weir.toml" > /dev/null 2>&1; t1=$(now)
        checks+=("$(echo "$t1 - $t0" | bc)")
        t0=$(now)
        "$BIN" --log-level error run --config "$DIR/weir.toml" > /dev/null 2>&1 &
        pid=$!
        until curl -sf -o /dev/null "http://127.0.0.1:$ADMIN/readyz"; do sleep 0.01; done
        t1=$(now)
        readys+=("$(echo "$t1 - $t0" | bc)")
        sleep 1
        rss+=("$(awk '/VmRSS/ {print $2/1024}' /proc/$pid/status)")
        lines=$(curl -s "http://127.0.0.1:$ADMIN/metrics" | wc -l)
        config "$n" 200
        t0=$(now); curl -sf -o /dev/null -X POST "http://127.0.0.1:$ADMIN/reload"; t1=$(now)
        reloads+=("$(echo "$t1 - $t0" | bc)")
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
    printf '| %s | %.2f s | %.2f s | %.2f s | %.0f MB | %s |\n' "$n" \
        "$(printf '%s\n' "${checks[@]}" | median)" \
        "$(printf '%s\n' "${readys[@]}" | median)" \
        "$(printf '%s\n' "${reloads[@]}" | median)" \
        "$(printf '%s\n' "${rss[@]}" | median)" "$lines"
done
