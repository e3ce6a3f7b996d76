#!/usr/bin/env python3
"""Summarise A/B runs of corewheel-perf: per variant, the median over rounds of the
engine's ratio against tokio in each main row (above 1: the engine is faster).

Usage: scripts/ablation-summary.py DIR, where DIR holds one file per run, named
<variant>-<round>.txt, each the whole output of one corewheel-perf run."""
import sys, re, glob, os, statistics
from collections import defaultdict
d = sys.argv[1]
rows = defaultdict(lambda: defaultdict(list))
for f in sorted(glob.glob(os.path.join(d, '*.txt'))):
    variant = os.path.basename(f).rsplit('-', 1)[0]
    section = None
    for line in open(f):
        m = re.match(r'^(engine-arm-cancel) \(window ([\d,]+)', line)
        if m: section = f'engine-arm-cancel w{m.group(2)}'; continue
        m = re.match(r'^light-load \(\d+ threads, ([\d,]+) timers live', line)
        if m: section = f'light-load {m.group(1)}/s'; continue
        m = re.match(r'^(steady-mix|light-load|fire-storm|burst-steal|engine-live-1m|engine-reset|async-\w+|keyed-[\w-]+) \(', line)
        if m: section = m.group(1); continue
        if section == 'engine-live-1m':
            # CPU ns per cancel, the process's (engine-live-1m's cancel cost) and the workers'.
            m = re.match(r'^(engine|tokio-sleep)\s+' + r'([\d,.]+)\s+' * 6 + r'(([\d,.]+) / ([\d,.]+))?', line)
            if m:
                rows[('engine-live-1m CPU ns/cancel', '-')][(variant, m.group(1))].append(float(m.group(7)))
                if m.group(9):
                    rows[('engine-live-1m workers CPU ns/cancel', '-')][(variant, m.group(1))].append(float(m.group(10)))
            continue
        m = re.match(r'^(engine|tokio-sleep|corewheel-async|tokio|keyed|delay-queue-map)(, (\d+))?\s+([\d,.]+)\s+([\d,.]+)', line)
        if m and section:
            subj, threads = m.group(1), m.group(3) or '-'
            a, b = float(m.group(4).replace(',', '')), float(m.group(5).replace(',', ''))
            # The cost column: wall ns per timer for engine-arm-cancel, engine-reset and the
            # keyed-* workloads (ns per operation); CPU ns per timer for steady-mix,
            # light-load and async-* (its CPU column comes first there).
            val = a if section.startswith(('engine-arm', 'engine-reset', 'async', 'keyed')) else b
            rows[(section, threads)][(variant, subj)].append(val)
variants = sorted({v for r in rows.values() for (v, _) in r})
print('row | ' + ' | '.join(f'{v}: engine cost (range), ratio vs tokio' for v in variants))
print('|'.join(['---'] * (len(variants) + 1)))
for (section, threads), r in sorted(rows.items()):
    cells = []
    for v in variants:
        ours = [x for (vv, s), xs in r.items() if vv == v and s in ('engine', 'corewheel-async', 'keyed') for x in xs]
        peer = [x for (vv, s), xs in r.items() if vv == v and s in ('tokio-sleep', 'tokio', 'delay-queue-map') for x in xs]
        if not ours:
            cells.append('');
            continue
        ratios = [p / o for o, p in zip(ours, peer)] if peer else []
        cells.append(f'{statistics.median(ours):.1f} ({min(ours):.1f}-{max(ours):.1f}), '
                     + (f'{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})' if ratios else '-'))
    print(f'{section}, {threads} | ' + ' | '.join(cells))
