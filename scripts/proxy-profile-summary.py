#!/usr/bin/env python3
"""Summarises the profiles of `PERF_RECORD=1 scripts/proxy-wrk.sh DIR N` per timer.

Reads DIR/r*-TIMER.perf-flat.txt (made by
`perf report -i TAG.perf.data --no-children --sort dso,symbol --stdio -g none`), the sample
counts in TAG.perf-record.log and the requests/s in DIR/results.tsv, and prints each
symbol's CPU per request, in µs, summed over the rounds: samples x (1/999 s) over the
requests served in perf's 6 s window (requests/s x 6), then groups: timer code, kernel,
allocator, the rest.
"""
import collections, glob, os, re, sys

d = sys.argv[1]
rps = {}
for line in list(open(os.path.join(d, "results.tsv")))[1:]:
    f = line.split()
    rps[(f[0], f[1])] = float(f[2])
per = collections.defaultdict(collections.Counter)  # timer -> symbol -> samples
reqs = collections.Counter()
for flat in sorted(glob.glob(os.path.join(d, "r*.perf-flat.txt"))):
    tag = os.path.basename(flat)[: -len(".perf-flat.txt")]
    rnd, timer = tag.split("-", 1)
    n = int(re.search(r"\((\d+) samples\)", open(flat.replace("perf-flat", "perf-record").replace(".txt", ".log")).read()).group(1))
    reqs[timer] += rps[(rnd[1:], timer)] * 6
    for line in open(flat):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*?)\s{2,}", line + "  ")
        if m:
            pct, dso, kind, sym = m.groups()
            per[timer][f"[{kind}] {sym[:90]}"] += float(pct) / 100 * n
us = lambda timer, samples: samples * (1e6 / 999) / reqs[timer]
timers = [t for t in ("corewheel", "corewheel-driven", "tokio") if t in per]
TIMER = re.compile(r"corewheel::|tokio::time|tokio::runtime::time|TokioTimer|hyper_util::rt::tokio::Tokio(Sleep|Timer)")
def group(sym):
    if TIMER.search(sym):
        return "timer code (corewheel::*, tokio::time / runtime::time)"
    if sym.startswith("[k]"):
        return "kernel"
    if re.search(r"mi_|mimalloc|_mi_", sym):
        return "allocator (mimalloc)"
    return "other user space"
print("CPU µs per request by group (sampled, summed over rounds):")
print(f"{'group':<58}" + "".join(f"{t:>18}" for t in timers))
groups = sorted({group(s) for t in timers for s in per[t]})
for g in groups + ["total"]:
    vals = [sum(v for s, v in per[t].items() if g == "total" or group(s) == g) for t in timers]
    print(f"{g:<58}" + "".join(f"{us(t, v):>18.2f}" for t, v in zip(timers, vals)))
print("\ntimer-code symbols (µs/request):")
syms = sorted({s for t in timers for s in per[t] if TIMER.search(s)}, key=lambda s: -max(us(t, per[t][s]) for t in timers))
for s in syms[:25]:
    print(f"{s[:100]:<100}" + "".join(f"{us(t, per[t][s]):>10.3f}" for t in timers))
print("\ntop symbols (µs/request):  " + "  ".join(timers))
top = collections.Counter()
for t in timers:
    for s, v in per[t].items():
        top[s] = max(top[s], us(t, v))
for s, _ in top.most_common(30):
    print(f"{s[:100]:<100}" + "".join(f"{us(t, per[t][s]):>10.3f}" for t in timers))
