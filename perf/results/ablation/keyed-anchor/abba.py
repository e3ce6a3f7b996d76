import csv, glob, statistics, re, sys, collections
D=sys.argv[1]
v=collections.defaultdict(dict)
for f in sorted(glob.glob(D+'/round*-*-*.csv')):
    m=re.search(r'round(\d+)-(before|after)-(a|b)\.csv',f); r,var,ab=int(m[1]),m[2],m[3]
    for row in csv.DictReader(open(f)):
        if row['subject']=='keyed' and row['metric'] in ('ns_per_timer','cpu_ns_per_timer'):
            v[(int(row['threads']),row['metric'])][(r,var,ab)]=float(row['value'])
print("| threads | metric | before: median (quartiles) | after: median (quartiles) | after/before of medians | per-round after/before (sum of the pair): median, quartiles | rounds after slower | A/A: before b / before a, median, quartiles |")
print("|---|---|---|---|---|---|---|---|")
for (t,mt),d in sorted(v.items()):
    rounds=sorted({k[0] for k in d})
    B=[d[(r,'before',x)] for r in rounds for x in 'ab']; A=[d[(r,'after',x)] for r in rounds for x in 'ab']
    qb=statistics.quantiles(B,n=4); qa=statistics.quantiles(A,n=4)
    pr=[(d[(r,'after','a')]+d[(r,'after','b')])/(d[(r,'before','a')]+d[(r,'before','b')]) for r in rounds]
    aa=[d[(r,'before','b')]/d[(r,'before','a')] for r in rounds]
    qp=statistics.quantiles(pr,n=4); qaa=statistics.quantiles(aa,n=4)
    print(f"| {t} | {mt} | {statistics.median(B):.1f} ({qb[0]:.1f}-{qb[2]:.1f}) | {statistics.median(A):.1f} ({qa[0]:.1f}-{qa[2]:.1f}) | {statistics.median(A)/statistics.median(B):.3f} | {statistics.median(pr):.3f} ({qp[0]:.3f}-{qp[2]:.3f}) | {sum(p>1 for p in pr)}/{len(pr)} | {statistics.median(aa):.3f} ({qaa[0]:.3f}-{qaa[2]:.3f}) |")
