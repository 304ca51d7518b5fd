#!/usr/bin/env python3
"""Self cost per request from two callgrind files of the same process run for
a short and a long load (bench/callgrind-peers.sh): every function's self
instructions in LONG minus those in SHORT, divided by the requests between
them, so start-up and shutdown cancel as in the slope of the totals.

    bench/cg-groups.py SHORT.cg LONG.cg REQUESTS [TOP]

Prints: self cost grouped by the function symbol's crate/prefix (h2::hpack,
h2, hyper::proto::h1, hyper::proto::h2, hyper_util, tokio, weir, allocator,
mem*, ring/rustls, ...); the same instructions grouped by the source file
they were compiled from (the crate directory of the path: with fat LTO much
of h2 and tokio is inlined into callers, and the line table still names the
file an inlined instruction came from); everything executed under calls
into the h2 crate (inclusive, an upper bound); who calls memcpy and malloc;
and the TOP (10) functions by self cost. Debian's haproxy and nginx are
stripped: only their exported functions have names, the rest group as
"unknown symbol" of their object.

Reads the callgrind format directly (fl/fi/fe/fn with name compression; the
cost line after a calls= line is that call's inclusive cost, kept apart from
self cost), so that the self-cost groups sum to the totals.
"""
import collections
import re
import sys


def parse(path):
    """→ (by (object, file-of-function, function) self Ir,
          by (object, source file of the instruction, function) self Ir,
          by (caller, callee) inclusive Ir of the calls, summary)"""
    names = {}  # (kind, id) → name; kinds: ob, fl (fl/fi/fe share ids), fn

    def name(kind, rest):
        m = re.match(r"\((\d+)\)(?:\s(.*))?$", rest)
        if not m:
            return rest
        key = (kind, m.group(1))
        if m.group(2) is not None:
            names[key] = m.group(2)
        return names.get(key, "???")

    by_fn = collections.Counter()
    by_src = collections.Counter()
    arcs = collections.Counter()
    ob = fl = src = fn = cfn = "???"
    skip_next_cost = False
    summary = 0
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line[0] == "#":
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if skip_next_cost:  # the inclusive cost of a call
                    skip_next_cost = False
                    parts = line.split()
                    if len(parts) > 1:
                        arcs[(fn, cfn)] += int(parts[1])
                    continue
                parts = line.split()
                if len(parts) > 1:
                    ir = int(parts[1])
                    by_fn[(ob, fl, fn)] += ir
                    by_src[(ob, src, fn)] += ir
                continue
            key, _, rest = line.partition("=")
            if key == "ob":
                ob = name("ob", rest)
            elif key == "fl":
                fl = src = name("fl", rest)
            elif key in ("fi", "fe"):
                src = name("fl", rest)
            elif key == "fn":
                fn = name("fn", rest)
            elif key in ("cob",):
                name("ob", rest)
            elif key in ("cfl", "cfi"):
                name("fl", rest)
            elif key == "cfn":
                cfn = name("fn", rest)
            elif key == "calls":
                skip_next_cost = True
            elif line.startswith("summary:"):
                summary = int(line.split()[1])
    return by_fn, by_src, arcs, summary


ALLOC = re.compile(r"^(_int_malloc|_int_free|_int_realloc|malloc|free|realloc|calloc|cfree|"
                   r"malloc_consolidate|__libc_(malloc|free|realloc|calloc)|tcache_\w+|"
                   r"unlink_chunk.*|__rust_(alloc|dealloc|realloc|alloc_zeroed)|"
                   r"alloc::alloc::\w+|__rdl_\w+|__rg_\w+|_int_memalign|sysmalloc)$")
MEM = re.compile(r"^(__)?(memcpy|memmove|memset|mempcpy|memcmp|bcmp|wmemset)\w*$")


def type_path(fn):
    """The leading path of a demangled Rust symbol: `<h2::X<T> as Tr>::f` → h2::X."""
    s = fn
    while True:
        s = s.lstrip("<&*")
        for p in ("mut ", "const ", "dyn "):
            if s.startswith(p):
                s = s[len(p):]
                break
        else:
            break
    return re.split(r"[<>\s(\[,]", s, maxsplit=1)[0]


PEERS = (  # named (exported) functions of the peers' stripped binaries
    ("haproxy", r"^(h2|h2c|h2s|hpack|huff)_", "haproxy: h2 mux + hpack"),
    ("haproxy", r"^(h1|h1c|h1s)_", "haproxy: h1 mux"),
    ("haproxy", r"^htx_", "haproxy: htx"),
    ("haproxy", r"^(__)?pool_", "haproxy: pools"),
    ("haproxy", r"", "haproxy: other named"),
    ("nginx", r"^ngx_http_(v2|huff)_", "nginx: http2 (incl. hpack)"),
    ("nginx", r"^ngx_http_grpc_", "nginx: grpc_pass"),
    ("nginx", r"^ngx_(palloc|pnalloc|pcalloc|pmemalign|pfree|alloc|calloc|create_pool|destroy_pool|reset_pool)",
     "nginx: pools"),
    ("nginx", r"", "nginx: other named"),
)


def fn_group(ob, fn):
    base = ob.rsplit("/", 1)[-1]
    if base in ("haproxy", "nginx") and not (fn == "???" or fn.startswith("0x")):
        for b, pattern, group in PEERS:
            if b == base and re.match(pattern, fn):
                return group
    if fn == "???" or fn.startswith("0x"):
        return "unknown symbol: " + ob.rsplit("/", 1)[-1]
    if ALLOC.match(fn):
        return "allocator (malloc/free)"
    if MEM.match(fn):
        return "memcpy/memmove/memset"
    p = type_path(fn)
    for prefix, group in (
        ("h2::hpack", "h2::hpack"),
        ("h2::", "h2 (not hpack)"),
        ("hyper::proto::h1", "hyper::proto::h1"),
        ("hyper::proto::h2", "hyper::proto::h2"),
        ("hyper::", "hyper (other)"),
        ("hyper_util::", "hyper_util"),
        ("tokio::", "tokio"),
        ("mio::", "mio"),
        ("weir::", "weir"),
        ("ring::", "ring/rustls"),
        ("rustls::", "ring/rustls"),
        ("bytes::", "bytes"),
        ("http::", "http"),
        ("core::", "core/alloc/std"),
        ("alloc::", "core/alloc/std"),
        ("std::", "core/alloc/std"),
        ("hashbrown::", "core/alloc/std"),
        ("futures_", "futures"),
        ("tracing", "tracing"),
    ):
        if p.startswith(prefix):
            return group
    if "/libc.so" in ob or "/libc-" in ob:
        return "libc (syscall wrappers, other)"
    if "/ld-linux" in ob or "vgpreload" in ob:
        return "ld.so/valgrind preload"
    return "other: " + (p.split("::")[0] if "::" in p else ob.rsplit("/", 1)[-1] or "?")


def src_group(ob, src):
    m = re.search(r"/registry/src/[^/]+/([A-Za-z0-9_\-]+?)-\d+\.\d+\.\d+[^/]*/(.*)", src)
    if m:
        crate, rest = m.group(1), m.group(2)
        if crate == "h2" and rest.startswith("src/hpack/"):
            return "h2::hpack"
        if crate == "h2":
            return "h2 (not hpack)"
        if crate == "hyper":
            for sub in ("proto/h1", "proto/h2"):
                if rest.startswith("src/" + sub):
                    return "hyper::" + sub.replace("/", "::")
            return "hyper (other)"
        if crate in ("ring", "rustls"):
            return "ring/rustls"
        return crate.replace("-", "_")
    if re.search(r"/rustc/[0-9a-f]+/library/", src) or "/lib/rustlib/" in src:
        return "core/alloc/std"
    if src.startswith("src/") or "/weir/src/" in src or "/main/src/" in src:
        return "weir"
    if src == "???":
        return "no line info: " + ob.rsplit("/", 1)[-1]
    return "other: " + src.rsplit("/", 1)[-1]


def main():
    short, long_, reqs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    f1, s1, a1, t1 = parse(short)
    f2, s2, a2, t2 = parse(long_)
    total = (t2 - t1) / reqs

    def diff(a, b):
        d = collections.Counter()
        for k in set(a) | set(b):
            d[k] = b.get(k, 0) - a.get(k, 0)
        return d

    dfn, dsrc, darcs = diff(f1, f2), diff(s1, s2), diff(a1, a2)
    g_fn, g_src = collections.Counter(), collections.Counter()
    for (ob, _fl, fn), v in dfn.items():
        g_fn[fn_group(ob, fn)] += v
    for (ob, src, _fn), v in dsrc.items():
        g_src[src_group(ob, src)] += v

    print(f"total: {total:.0f} instructions per request ({t2 - t1} over {reqs:.0f} requests)")
    for title, g in (("by function symbol (self cost)", g_fn),
                     ("by source file of the instruction (self cost, inlining resolved)", g_src)):
        print()
        print(f"| group, {title} | instructions per request | share |")
        print("|---|---|---|")
        rest = 0.0
        for k, v in g.most_common():
            per = v / reqs
            if abs(per) < 0.005 * total:
                rest += per
                continue
            print(f"| {k} | {per:.0f} | {100 * per / total:.1f}% |")
        print(f"| (groups under 0.5% each) | {rest:.0f} | {100 * rest / total:.1f}% |")
    # Inclusive: every instruction executed under a call from outside the h2
    # crate into it (its callees too: malloc, memcpy, http's HeaderMap, the
    # user-space side of socket reads and writes, wakers), an upper bound.
    # A call back out of h2 that re-enters it would count twice; h2 calls
    # no code of its users but I/O, Buf and wakers.
    under = sum(v for (caller, callee), v in darcs.items()
                if type_path(callee).startswith("h2::") and not type_path(caller).startswith("h2::"))
    if under:
        print()
        print(f"inclusive under the h2 crate (calls from outside h2:: into it, callees included): "
              f"{under / reqs:.0f} instructions per request ({100 * under / reqs / total:.1f}%)")
    # Who pays for the copies and the allocations: calls into memcpy & co.
    # and into malloc/free, by the caller's group (inclusive of the call).
    for target in ("memcpy/memmove/memset", "allocator (malloc/free)"):
        by = collections.Counter()
        for (caller, callee), v in darcs.items():
            if fn_group("", callee) == target and fn_group("", caller) != target:
                by[fn_group("", caller)] += v
        if sum(by.values()) / reqs < 0.01 * total:
            continue
        print()
        print(f"calls into {target}, by caller: " + ", ".join(
            f"{k} {v / reqs:.0f}" for k, v in by.most_common() if v / reqs >= 0.005 * total))
    print()
    print(f"| top {top} functions by self cost | group | instructions per request |")
    print("|---|---|---|")
    for (ob, _fl, fn), v in dfn.most_common(top):
        shown = fn if len(fn) <= 110 else fn[:107] + "..."
        shown = shown.replace("|", "\\|")
        print(f"| `{shown}` | {fn_group(ob, fn)} | {v / reqs:.0f} |")


if __name__ == "__main__":
    main()
