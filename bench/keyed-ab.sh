#!/usr/bin/env bash
# What an idempotency key costs: one weir (one worker, in front of nginx),
# its store filled first (every new record then evicts one, as in a long
# run), then alternating wrk runs of a 1 KiB POST without and with a new
# Idempotency-Key on each (bench/shapes/post1k*.lua); weir's CPU µs per
# request from /proc for each run (all of it, and the user-space part, where
# the key's work is), each pair's difference, and the medians. Interleaving
# keeps a noisy machine's drift out of the pairs; the unkeyed median says
# how fast the machine ran meanwhile.
#
#   PAIRS=10 DUR=3 bench/keyed-ab.sh        # WEIR=path to test another build
#   STORE_BYTES=262144 bench/keyed-ab.sh    # a store that fits in the CPU's caches (default 16 MiB)
# Needs wrk and nginx. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
start_nginx_upstream 18190
cat > "$T/weir.toml" <<CONF
[server]
listen = "127.0.0.1:18191"
admin = "127.0.0.1:18192"
[upstreams.bench]
url = "http://127.0.0.1:18190"
hosts = ["127.0.0.1", "localhost"]
[upstreams.bench.retry]
max_attempts = 3
[upstreams.bench.rate_limit]
rps = 10000000.0
burst = 10000000
[upstreams.bench.idempotency]
max_bytes = ${STORE_BYTES:-16777216}
CONF
"${WEIR:-target/release/weir}" --log-level error run --workers 1 --config "$T/weir.toml" &
W=$!; PIDS+=($W)
wait_port 18191
# warm up, and fill the store (evicting from then on, as in a long run)
wrk -t1 -c4 -d8s -s bench/shapes/post1k-keyed.lua http://127.0.0.1:18191/ >/dev/null
# CPU µs per request of one wrk run: "total user" (utime+stime, utime).
run() {
  local a b r
  a=$(awk '{print $14+$15, $14}' /proc/$W/stat)
  r=$(wrk -t1 -c4 -d${DUR:-3}s -s bench/shapes/$1.lua http://127.0.0.1:18191/ | awk '/requests in/ {print $1}')
  b=$(awk '{print $14+$15, $14}' /proc/$W/stat)
  echo "$a $b $r" | awk '{printf "%.3f %.3f\n", ($3-$1)*10000/$5, ($4-$2)*10000/$5}'
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
: > "$T/pairs"
for i in $(seq 1 ${PAIRS:-10}); do
  read -r ut uu < <(run post1k); read -r kt ku < <(run post1k-keyed)
  echo "$ut $kt $uu $ku" >> "$T/pairs"
  awk -v i=$i -v ut=$ut -v kt=$kt -v uu=$uu -v ku=$ku 'BEGIN{printf "pair %d: unkeyed %.2f keyed %.2f diff %+.2f (user: %.2f %.2f %+.2f)\n", i, ut, kt, kt-ut, uu, ku, ku-uu}'
done
d=$(awk '{print $2-$1}' "$T/pairs" | median)
du=$(awk '{print $4-$3}' "$T/pairs" | median)
u=$(awk '{print $1}' "$T/pairs" | median)
r=$(awk '{print ($2-$1)/$1}' "$T/pairs" | median)
printf 'median over %d pairs: unkeyed %.2f µs/request; the key adds %.2f µs (%.1f %% of it), %.2f µs of it in user space\n' \
  "${PAIRS:-10}" "$u" "$d" "$(awk -v r=$r 'BEGIN{print r*100}')" "$du"
