#!/usr/bin/env python3
"""Checks the tables of `weir chaos overload` and `weir chaos overload-shed`
against issue 45's targets (docs/reference/admission.md#adaptive-limit).

    python3 bench/overload-check.py OVERLOAD.md [SHED.md]

Reads the Markdown the two scenarios print (with or without `--via`
columns; any file may hold either, or both) and prints one row per check.
Exits 1 when a check fails, 2 when a table is missing what a check needs.
Used by bench/overload-gate.sh (weir alone) and bench/overload.sh (with
Envoy beside it).

weir's adaptive limit (the column "weir, adaptive", and a `--via` column
whose name starts with "weir"):
  - at 0.5x it refuses at most 5 % of the requests (slow start from a
    limit of 4 refuses while it grows; 0.1 % before 2026-12-07, when it
    started at 12 and flooded small upstreams instead);
  - at 2x and 4x its goodput is >= 90 % of the upstream's capacity (as
    measured before the levels, when the report has it: its slots kept
    busy straight; else the nominal slots / service) and the
    answered requests' p99 <= 2x the unloaded latency (the adaptive
    column's answered median at 0.5x, where nothing queues);
  - when the upstream's slots halve, the limit is at or below 1.5x the new
    slots within 5 s;
  - beside another proxy's `--via` column (Envoy's adaptive concurrency
    filter), at 2x and 4x its goodput and p99 are at least as good.
No weir and the fixed limit at 2x and 4x are printed for contrast (they
are expected to collapse), not checked.

Client-side throttling (overload-shed), at each level: goodput with it is
>= 90 % of goodput without, and weir's throttle refused some; at 4x, the
upstream refuses at most half as many a second with it as without (at 2x
it is sent little more than twice what it accepts even without throttling,
about what throttling's K = 2 lets through, so there is less to take off).
"""
import re
import sys

ADAPTIVE = "weir, adaptive"
NO_WEIR = "no weir"
FIXED = "weir, fixed limit (default)"
UNTHROTTLED = "weir, no throttling (default)"
THROTTLED = "weir, throttling"


def sections(text):
    """{scenario name: its lines}, split at each `scenario: NAME —` line."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"scenario: (\S+) —", line)
        if m:
            name = m.group(1)
            out[name] = []
        if name:
            out[name].append(line)
    return out


def table(lines):
    """{load: {row label: {column: cell}}} from the table's rows."""
    heads, levels, load = None, {}, None
    for line in lines:
        if not line.startswith("|"):
            if heads and levels:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "load":
            heads = cells[2:]
            continue
        if heads is None or cells[0].startswith("---"):
            continue
        m = re.match(r"([\d.]+)×", cells[0])
        if m:
            load = float(m.group(1))
            levels[load] = {}
        if load is not None:
            levels[load][cells[1]] = dict(zip(heads, cells[2:]))
    return heads or [], levels


def num(cell, pattern=r"([\d.]+)"):
    m = re.search(pattern, cell or "")
    return float(m.group(1)) if m else None


rows, failed, missing = [], False, False


def check(what, measured, target, ok):
    global failed, missing
    if ok is None:
        missing = True
        verdict = "no figure"
    else:
        verdict = "met" if ok else "**missed**"
        failed |= not ok
    rows.append(f"| {what} | {measured} | {target} | {verdict} |")


def overload(lines):
    nominal = num(" ".join(lines[:1]), r"capacity ([\d.]+)/s")
    # What the upstream really serves (its slots kept busy straight, before
    # the levels): a 20 ms sleep takes about 21 ms, so the nominal figure
    # is more than it can do. Older reports have only the nominal one.
    measured = num("\n".join(lines[:4]), r"measured capacity ([\d.]+)/s")
    cap = measured or nominal
    heads, levels = table(lines)
    half = levels.get(0.5, {})
    weirs = [ADAPTIVE] + [h for h in heads if h.startswith("weir") and h not in (ADAPTIVE, FIXED)]
    others = [h for h in heads if h not in (NO_WEIR, FIXED) and h not in weirs]
    unloaded = num(half.get("p50 answered", {}).get(ADAPTIVE))
    for col in weirs:
        refused = num(half.get("refused", {}).get(col), r"^(\d+)")
        of = num(half.get("client gave up", {}).get(col), r"of (\d+)")
        share = None if refused is None or not of else refused * 100.0 / of
        check(f"{col}: refused at 0.5×",
              "—" if share is None else f"{refused:.0f} of {of:.0f} ({share:.2f} %)",
              "≤ 5 %", None if share is None else share <= 5.0)
        for load in (2.0, 4.0):
            lv = levels.get(load, {})
            g = num(lv.get("goodput", {}).get(col))
            of = "measured" if measured else "nominal"
            check(f"{col}: goodput at {load:g}×",
                  "—" if g is None or not cap else f"{g:.0f}/s ({g * 100 / cap:.1f} % of {of}"
                  + (f", {g * 100 / nominal:.1f} % of nominal {nominal:.0f}/s)" if measured and nominal else ")"),
                  f"≥ {0.9 * cap:.0f}/s (90 % of {cap:.0f}/s, {of})" if cap else "≥ 90 %",
                  None if g is None or not cap else g >= 0.9 * cap)
            p99 = num(lv.get("p99 answered", {}).get(col))
            check(f"{col}: p99 answered at {load:g}×",
                  "—" if p99 is None or not unloaded else f"{p99:.1f} ms ({p99 / unloaded:.2f}× unloaded {unloaded:.1f} ms)",
                  "≤ 2× unloaded",
                  None if p99 is None or not unloaded else p99 <= 2 * unloaded)
            for other in others:
                og = num(lv.get("goodput", {}).get(other))
                op = num(lv.get("p99 answered", {}).get(other))
                check(f"{col} beside {other} at {load:g}×: goodput",
                      f"{g:.0f}/s against {og:.0f}/s" if g is not None and og is not None else "—",
                      "at least as high",
                      None if g is None or og is None else g >= og)
                check(f"{col} beside {other} at {load:g}×: p99",
                      f"{p99:.1f} ms against {op:.1f} ms" if p99 is not None and op is not None else "—",
                      "at most as high",
                      None if p99 is None or op is None else p99 <= op)
    m = re.search(r"the limit is at or below (\d+) \(1\.5× the new slots\) (never|([\d.]+) s) after it",
                  "\n".join(lines))
    if m:
        after = None if m.group(3) is None else float(m.group(3))
        check(f"{ADAPTIVE}: the limit follows a halving (≤ {m.group(1)})",
              "never" if after is None else f"{after:.2f} s", "≤ 5 s",
              after is not None and after <= 5.0)
    contrast = []
    for load in (2.0, 4.0):
        lv = levels.get(load, {})
        for col in (NO_WEIR, FIXED):
            g = lv.get("goodput", {}).get(col)
            p = lv.get("p99 answered", {}).get(col)
            if g and p:
                contrast.append(f"{col} at {load:g}×: {g}, p99 {p}")
    return contrast


def shed(lines):
    _, levels = table(lines)
    for load, lv in sorted(levels.items()):
        off_shed = num(lv.get("upstream refused", {}).get(UNTHROTTLED))
        on_shed = num(lv.get("upstream refused", {}).get(THROTTLED))
        if load >= 4.0:
            check(f"throttling at {load:g}×: the upstream's refusals",
                  "—" if None in (on_shed, off_shed) else f"{on_shed:.0f}/s against {off_shed:.0f}/s without",
                  "at most half",
                  None if None in (on_shed, off_shed) else 2 * on_shed <= off_shed)
        off_g = num(lv.get("goodput", {}).get(UNTHROTTLED))
        on_g = num(lv.get("goodput", {}).get(THROTTLED))
        check(f"throttling at {load:g}×: goodput",
              "—" if None in (on_g, off_g) else f"{on_g:.0f}/s against {off_g:.0f}/s without",
              "≥ 90 % of without",
              None if None in (on_g, off_g) else on_g >= 0.9 * off_g)
        t = num(lv.get("refused by weir (throttle)", {}).get(THROTTLED))
        check(f"throttling at {load:g}×: weir's throttle refused",
              "—" if t is None else f"{t:.0f}/s", "> 0", None if t is None else t > 0)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    found, contrast = {}, []
    for path in sys.argv[1:]:
        found.update(sections(open(path).read()))
    if "overload" in found:
        contrast = overload(found["overload"])
    if "overload-shed" in found:
        shed(found["overload-shed"])
    if not rows:
        sys.exit("no `weir chaos overload` or `overload-shed` table in " + " ".join(sys.argv[1:]))
    print("| check | measured | target | verdict |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    if contrast:
        print("\nFor contrast (not checked): " + "; ".join(contrast))
    if failed:
        print("\nA target was missed.")
        sys.exit(1)
    if missing:
        print("\nA figure was missing.")
        sys.exit(2)
    print("\nEvery target met.")


main()
