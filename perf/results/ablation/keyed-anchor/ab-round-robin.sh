#!/bin/bash
# Runs the A/B in turns; round 1's "before" was run first, by hand, with the same command.
cd /work/wt-keyed
D=perf/results/ablation/keyed-anchor
run() { # $1 = before|after, $2 = round
  uptime > $D/round$2-$1.load
  target/ab-$1 --workloads keyed-set-remove,keyed-set-over,keyed-move --peers keyed,delay-queue-map > $D/round$2-$1.txt 2>&1
  dir=$(grep -o '/work/wt-keyed/perf-runs/[^ ]*' $D/round$2-$1.txt | tail -1)
  cp $dir/results.csv $D/round$2-$1.csv
}
run after 1
for r in 2 3 4 5 6 7; do run before $r; run after $r; done
echo finished
