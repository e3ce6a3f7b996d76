#!/bin/bash
# Focused A/B: KeyedTimers alone, the three keyed workloads, 15 rounds in turns.
cd /work/wt-keyed
D=perf/results/ablation/keyed-anchor/focused
run() { # $1 = before|after, $2 = round
  uptime > $D/round$2-$1.load
  target/ab-$1 --workloads keyed-set-remove,keyed-set-over,keyed-move --peers keyed > $D/round$2-$1.txt 2>&1
  dir=$(grep -o '/work/wt-keyed/perf-runs/[^ ]*' $D/round$2-$1.txt | tail -1)
  cp $dir/results.csv $D/round$2-$1.csv
}
for r in $(seq 1 15); do
  if [ $((r % 2)) = 1 ]; then run before $r; run after $r; else run after $r; run before $r; fi
done
echo finished
