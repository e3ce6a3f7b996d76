#!/bin/bash
# keyed-set-remove alone (the workload that arms a new timer per operation), KeyedTimers
# alone, 1 and 2 threads; 25 rounds, each before, after, after, before (ABBA), so that a
# drift in the machine's load within a round falls on both sides equally.
cd /work/wt-keyed
D=perf/results/ablation/keyed-anchor/set-remove
run() { # $1 = before|after, $2 = round, $3 = which of the pair (a|b)
  uptime > $D/round$2-$1-$3.load
  target/ab-$1 --workloads keyed-set-remove --peers keyed --threads 1,2 > $D/round$2-$1-$3.txt 2>&1
  dir=$(grep -o '/work/wt-keyed/perf-runs/[^ ]*' $D/round$2-$1-$3.txt | tail -1)
  cp $dir/results.csv $D/round$2-$1-$3.csv
}
for r in $(seq 1 25); do run before $r a; run after $r a; run after $r b; run before $r b; done
echo finished
