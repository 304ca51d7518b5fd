#!/usr/bin/env bash
# What an idempotency key costs. Two weirs (one worker each, pinned with
# nginx on one CPU, wrk on the other, as bench/compare.sh pins) in front of
# nginx: A keeps the upstream's store (16 MiB, filled first, so every new
# record evicts one, as in a long run), B has it off (`enabled = false`).
# Each round runs, back to back:
#   unkeyed  a 1 KiB POST through A (bench/shapes/post1k.lua)
#   keyed    the same with a new Idempotency-Key on each, through A
#            (post1k-keyed.lua: fingerprinted, recorded, response kept)
#   store off the keyed requests through B: the same bytes, no record
# and takes weir's CPU µs per request from /proc (all of it, and the user-
# space part, where the key's work is). It prints each round, then the
# medians of the per-round differences: what the key adds (keyed −
# unkeyed), and of that what the store's work is (keyed − store off: the
# fingerprint, the record, the kept response) rather than the longer
# request. Interleaving keeps a noisy machine's drift out of the rounds;
# the unkeyed median says how fast the machine ran meanwhile. A round in
# which the hypervisor took the CPUs away from this VM for more than 1 % of
# the time (steal, from /proc/stat) is printed but left out of the medians:
# its CPU figures are not the proxy's (the guest kernel's time per request
# jumps ten-fold in such rounds). MAX_STEAL=100 keeps every round.
#
#   PAIRS=20 DUR=2 bench/keyed-ab.sh        # WEIR=path to test another build
#   STORE_BYTES=262144 bench/keyed-ab.sh    # a store that fits in the CPU's caches
# Needs wrk, nginx and taskset. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
pin_load="taskset -c 0"; pin_proxy="taskset -c 1"
if [ "$(nproc)" -lt 2 ] || ! command -v taskset >/dev/null; then pin_load=""; pin_proxy=""; fi
start_nginx_upstream 18190 $pin_proxy
weir() { # PORT ENABLED
  cat > "$T/weir-$1.toml" <<CONF
[server]
listen = "127.0.0.1:$1"
admin = "127.0.0.1:$(($1 + 1))"
[upstreams.bench]
url = "http://127.0.0.1:18190"
hosts = ["127.0.0.1", "localhost"]
[upstreams.bench.retry]
max_attempts = 3
[upstreams.bench.rate_limit]
rps = 10000000.0
burst = 10000000
[upstreams.bench.idempotency]
enabled = $2
max_bytes = ${STORE_BYTES:-16777216}
CONF
  $pin_proxy "${WEIR:-target/release/weir}" --log-level error run --workers 1 --config "$T/weir-$1.toml" &
  PIDS+=($!)
  wait_port "$1"
}
weir 18191 true; A=${PIDS[-1]}
weir 18193 false; B=${PIDS[-1]}
# warm both up, and fill A's store (evicting from then on, as in a long run)
$pin_load wrk -t1 -c4 -d8s -s bench/shapes/post1k-keyed.lua http://127.0.0.1:18191/ >/dev/null
$pin_load wrk -t1 -c4 -d2s -s bench/shapes/post1k-keyed.lua http://127.0.0.1:18193/ >/dev/null
# CPU µs per request of one wrk run: SHAPE PID PORT -> "total user".
run() {
  local a b r
  a=$(awk '{print $14+$15, $14}' /proc/$2/stat)
  r=$($pin_load wrk -t1 -c4 -d${DUR:-2}s -s bench/shapes/$1.lua http://127.0.0.1:$3/ | awk '/requests in/ {print $1}')
  b=$(awk '{print $14+$15, $14}' /proc/$2/stat)
  echo "$a $b $r" | awk '{printf "%.3f %.3f\n", ($3-$1)*10000/$5, ($4-$2)*10000/$5}'
}
steal() { awk '/^cpu /{print $9}' /proc/stat; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
: > "$T/rounds"
for i in $(seq 1 ${PAIRS:-20}); do
  s0=$(steal); t0=$(date +%s.%N)
  read -r ut uu < <(run post1k $A 18191)
  read -r kt ku < <(run post1k-keyed $A 18191)
  read -r ot ou < <(run post1k-keyed $B 18193)
  # steal as a percentage of the round's CPU time (USER_HZ ticks, all CPUs)
  st=$(awk -v s=$(( $(steal) - s0 )) -v t0=$t0 -v t1=$(date +%s.%N) -v n=$(nproc) \
    'BEGIN{printf "%.1f", s / ((t1 - t0) * 100 * n) * 100}')
  keep=$(awk -v st=$st -v max=${MAX_STEAL:-1} 'BEGIN{print (st <= max) ? "" : "  (left out)"}')
  [ -z "$keep" ] && echo "$ut $kt $ot $uu $ku $ou" >> "$T/rounds"
  printf 'round %d: unkeyed %.2f, keyed %.2f, store off %.2f (user: %.2f, %.2f, %.2f); steal %s %%%s\n' \
    "$i" "$ut" "$kt" "$ot" "$uu" "$ku" "$ou" "$st" "$keep"
done
kept=$(wc -l < "$T/rounds")
[ "$kept" -gt 0 ] || { echo "every round had steal over ${MAX_STEAL:-1} %: no figure" >&2; exit 1; }
m() { awk "{print $1}" "$T/rounds" | median; }
printf 'medians over %d of %d rounds (weir CPU µs/request):\n' "$kept" "${PAIRS:-20}"
printf '  unkeyed POST                        %.2f (user %.2f)\n' "$(m '$1')" "$(m '$4')"
printf '  the key adds (keyed - unkeyed)      %+.2f (user %+.2f), %.1f %% of an unkeyed POST\n' \
  "$(m '$2-$1')" "$(m '$5-$4')" "$(m '($2-$1)/$1*100')"
printf '  the store adds (keyed - store off)  %+.2f (user %+.2f)\n' "$(m '$2-$3')" "$(m '$5-$6')"
