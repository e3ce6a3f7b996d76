import csv, glob, statistics, re, sys, collections
D=sys.argv[1]
# per-invocation median ns/op and cpu ns/op, per (workload, subject, threads, variant)
data=collections.defaultdict(list)
for f in sorted(glob.glob(D+'/round*-*.csv')):
    m=re.search(r'round(\d+)-(before|after)\.csv',f); rnd,var=int(m[1]),m[2]
    for row in csv.DictReader(open(f)):
        if row['metric'] in ('ns_per_timer','cpu_ns_per_timer'):
            data[(row['workload'],row['subject'],int(row['threads']),row['metric'],var)].append(float(row['value']))
wl=['keyed-set-remove','keyed-set-over','keyed-move']
for metric in ('ns_per_timer','cpu_ns_per_timer'):
    print(f"\n## {metric} (median of the rounds' medians; min-max across rounds; n rounds)")
    print("| workload | threads | subject | before | after | after/before |")
    print("|---|---|---|---|---|---|")
    for w in wl:
        for t in (1,2):
            for s in ('keyed','delay-queue-map'):
                b=data[(w,s,t,metric,'before')]; a=data[(w,s,t,metric,'after')]
                if not b: continue
                mb,ma=statistics.median(b),statistics.median(a)
                print(f"| {w} | {t} | {s} | {mb:.1f} ({min(b):.1f}-{max(b):.1f}, n={len(b)}) | {ma:.1f} ({min(a):.1f}-{max(a):.1f}, n={len(a)}) | {ma/mb:.3f} |")
    if not data[(wl[0],'delay-queue-map',1,metric,'before')]:
        continue
    print(f"\n### keyed vs delay-queue-map (tokio-util DelayQueue), {metric}: DelayQueue cost / keyed cost, median")
    print("| workload | threads | before | after |")
    print("|---|---|---|---|")
    for w in wl:
        for t in (1,2):
            r={}
            for var in ('before','after'):
                r[var]=statistics.median(data[(w,'delay-queue-map',t,metric,var)])/statistics.median(data[(w,'keyed',t,metric,var)])
            print(f"| {w} | {t} | {r['before']:.2f}x | {r['after']:.2f}x |")
