#!/usr/bin/env bash
# What an idempotency key costs: one weir (one worker, in front of nginx),
# its store filled first (every new record then evicts one, as in a long
# run), then alternating wrk runs of a 1 KiB POST without and with a new
# Idempotency-Key on each (bench/shapes/post1k*.lua); weir's CPU µs per
# request from /proc for each run, each pair's difference, and the median
# difference. Interleaving keeps a noisy machine's drift out of the pairs.
#
#   PAIRS=10 DUR=3 bench/keyed-ab.sh        # WEIR=path to test another build
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
CONF
"${WEIR:-target/release/weir}" --log-level error run --workers 1 --config "$T/weir.toml" &
W=$!; PIDS+=($W)
wait_port 18191
# warm up, and fill the store (evicting from then on, as in a long run)
wrk -t1 -c4 -d8s -s bench/shapes/post1k-keyed.lua http://127.0.0.1:18191/ >/dev/null
run() {
  local a b r
  a=$(awk '{print $14+$15}' /proc/$W/stat)
  r=$(wrk -t1 -c4 -d${DUR:-3}s -s bench/shapes/$1.lua http://127.0.0.1:18191/ | awk '/requests in/ {print $1}')
  b=$(awk '{print $14+$15}' /proc/$W/stat)
  awk -v a=$a -v b=$b -v r=$r 'BEGIN{printf "%.3f", (b-a)*10000/r}'
}
diffs=()
for i in $(seq 1 ${PAIRS:-10}); do
  u=$(run post1k); k=$(run post1k-keyed)
  d=$(awk -v u=$u -v k=$k 'BEGIN{printf "%.3f", k-u}')
  echo "pair $i: unkeyed $u keyed $k diff $d"
  diffs+=($d)
done
printf '%s\n' "${diffs[@]}" | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "median difference: %.2f µs/request over %d pairs\n", m, NR}'
