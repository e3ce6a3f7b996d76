import csv, glob, statistics, re, sys, collections
D=sys.argv[1]
vals=collections.defaultdict(dict)
for f in sorted(glob.glob(D+'/round*-*.csv')):
    m=re.search(r'round(\d+)-(before|after)\.csv',f); rnd,var=int(m[1]),m[2]
    for row in csv.DictReader(open(f)):
        if row['subject']=='keyed' and row['metric'] in ('ns_per_timer','cpu_ns_per_timer'):
            vals[(row['workload'],int(row['threads']),row['metric'])][(rnd,var)]=float(row['value'])
print("| workload | threads | metric | paired after/before: median | quartiles | min-max | rounds after slower |")
print("|---|---|---|---|---|---|---|")
for (w,t,mt),d in vals.items():
    rounds=sorted({r for r,_ in d if (r,'before') in d and (r,'after') in d})
    rs=[d[(r,'after')]/d[(r,'before')] for r in rounds]
    q=statistics.quantiles(rs,n=4)
    print(f"| {w} | {t} | {mt} | {statistics.median(rs):.3f} | {q[0]:.3f}-{q[2]:.3f} | {min(rs):.3f}-{max(rs):.3f} | {sum(r>1 for r in rs)}/{len(rs)} |")
