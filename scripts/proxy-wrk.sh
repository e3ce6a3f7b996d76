#!/usr/bin/env bash
# A/B of corewheel-proxy's timer back-ends under wrk, in turns.
#
#   scripts/proxy-wrk.sh OUTDIR [ROUNDS]
#
# Starts nginx (its own config under /tmp, worker_processes 1, `return 200 "ok"` on
# 127.0.0.1:$NGINX_PORT), then for ROUNDS rounds (default 4) and, within each round, for
# each timer in $TIMERS (default: corewheel corewheel-driven tokio) in turns (round r starts
# at the r-th timer, so that each takes each place in the order; ROTATE=0 keeps the order
# fixed; an entry LABEL=BINARY:TIMER runs another build of the proxy under LABEL), starts the
# release proxy in front of nginx (default threads), runs a short warm-up, then
#   wrk -t1 -c256 -d8s --latency http://127.0.0.1:$PROXY_PORT/
# and records requests/s, latency p99 and the proxy's CPU (utime+stime from
# /proc/PID/stat before and after the measured run; also per thread, from
# /proc/PID/task/*/stat) as µs of CPU per request (ms per 1,000). It stops the proxy, and at the
# end prints a table (median and min-max per timer) and writes it with every raw output
# into OUTDIR. All traffic stays on 127.0.0.1.
#
# Needs wrk and nginx; without them it says so and exits 0 (a skip). Build first:
#   cargo build --release -p corewheel-proxy
# PERF_RECORD=1 also profiles each measured run (its CPU figures then include perf's cost):
#   perf record -F 999 -g -p PID -- sleep 6   (from 1 s into the run)
#   perf report --no-children --sort symbol --stdio -g none | head -60  -> OUTDIR/TAG.perf-report.txt
# (also per thread, TAG.perf-threads.txt, and every symbol, TAG.perf-flat.txt, which
# scripts/proxy-profile-summary.py OUTDIR turns into µs per request per symbol). Delete
# the TAG.perf.data files before committing.
# Environment: WRK_DURATION (8s), WRK_CONNECTIONS (256), WRK_THREADS (1), WARMUP (1s),
# NGINX_PORT (18080), PROXY_PORT (18081), PROXY (target/release/corewheel-proxy).
set -euo pipefail

OUT=${1:?usage: scripts/proxy-wrk.sh OUTDIR [ROUNDS]}
ROUNDS=${2:-4}
TIMERS=${TIMERS:-"corewheel corewheel-driven tokio"}
DURATION=${WRK_DURATION:-8s}
CONNS=${WRK_CONNECTIONS:-256}
WTHREADS=${WRK_THREADS:-1}
WARMUP=${WARMUP:-1s}
NGINX_PORT=${NGINX_PORT:-18080}
PROXY_PORT=${PROXY_PORT:-18081}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROXY=${PROXY:-$ROOT/target/release/corewheel-proxy}

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
if [ ${#missing[@]} -gt 0 ]; then
    echo "########################################################################"
    echo "## SKIPPED: proxy-wrk.sh needs ${missing[*]}, which is not installed."
    echo "## Install with: apt-get update && apt-get install -y wrk nginx"
    echo "########################################################################"
    exit 0
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if [ ! -x "$PROXY" ]; then
    echo "no proxy binary at $PROXY: run cargo build --release -p corewheel-proxy" >&2
    exit 1
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CLK_TCK=$(getconf CLK_TCK)
NGX_DIR=$(mktemp -d /tmp/proxy-wrk-nginx.XXXXXX)
cat > "$NGX_DIR/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $NGX_DIR/nginx.pid;
error_log $NGX_DIR/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $NGX_DIR/body;
    proxy_temp_path $NGX_DIR/proxy;
    fastcgi_temp_path $NGX_DIR/fastcgi;
    uwsgi_temp_path $NGX_DIR/uwsgi;
    scgi_temp_path $NGX_DIR/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / { return 200 "ok"; }
    }
}
CONF
cp "$NGX_DIR/nginx.conf" "$OUT/nginx.conf"

NGINX_PID= PROXY_PID=
cleanup() {
    [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null && wait "$PROXY_PID" 2>/dev/null || true
    [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null && wait "$NGINX_PID" 2>/dev/null || true
    rm -rf "$NGX_DIR"
}
trap cleanup EXIT

wait_port() { # port: waits up to 10 s for something to listen on 127.0.0.1:port
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on 127.0.0.1:$1" >&2
    return 1
}

cpu_ticks() { # pid: utime+stime in clock ticks (fields 14 and 15; comm may hold spaces)
    local stat
    stat=$(cat "/proc/$1/stat")
    stat=${stat##*) }
    awk '{ print $12 + $13 }' <<<"$stat"
}

thread_ticks() { # pid: "tid comm utime+stime voluntary-switches involuntary-switches"
    local t stat comm switches
    for t in /proc/"$1"/task/*; do
        stat=$(cat "$t/stat" 2>/dev/null) || continue
        comm=$(cat "$t/comm" 2>/dev/null | tr ' ' '_')
        switches=$(awk '/^voluntary_ctxt_switches/ { v = $2 } /^nonvoluntary_ctxt_switches/ { n = $2 }
            END { print v + 0, n + 0 }' "$t/status" 2>/dev/null)
        stat=${stat##*) }
        echo "${t##*/} $comm $(awk '{ print $12 + $13 }' <<<"$stat") $switches"
    done
}

"$NGINX" -p "$NGX_DIR" -c "$NGX_DIR/nginx.conf" -e "$NGX_DIR/error.log" &
NGINX_PID=$!
wait_port "$NGINX_PORT"

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -srm), $(nproc) CPUs"
    echo "command: scripts/proxy-wrk.sh $* (rounds $ROUNDS, timers $TIMERS, rotate ${ROTATE:-1})"
    echo "wrk: wrk -t$WTHREADS -c$CONNS -d$DURATION --latency (warm-up $WARMUP, not counted)"
    echo "proxy: $PROXY --upstream 127.0.0.1:$NGINX_PORT --listen 127.0.0.1:$PROXY_PORT --timer T"
    echo "CLK_TCK: $CLK_TCK"
    echo "load before: $(cat /proc/loadavg)"
} > "$OUT/run-info.txt"
echo "round timer rps p99_ms cpu_ticks requests cpu_us_per_req errors load1" > "$OUT/results.tsv"

read -r -a TIMER_LIST <<<"$TIMERS"
for round in $(seq "$ROUNDS"); do
    order=()
    for i in "${!TIMER_LIST[@]}"; do
        shift_by=$(( ${ROTATE:-1} == 0 ? 0 : round - 1 ))
        order+=("${TIMER_LIST[$(( (i + shift_by) % ${#TIMER_LIST[@]} ))]}")
    done
    for entry in "${order[@]}"; do
        # An entry is a timer name, or LABEL=BINARY:TIMER to A/B two builds of the proxy.
        timer=$entry binary=$PROXY
        if [[ $entry == *=*:* ]]; then
            binary=${entry#*=} && timer=${binary##*:} && binary=${binary%:*}
            timer_flag=$timer timer=${entry%%=*}
        else
            timer_flag=$timer
        fi
        tag="r${round}-${timer}"
        "$binary" --upstream "127.0.0.1:$NGINX_PORT" --listen "127.0.0.1:$PROXY_PORT" \
            --timer "$timer_flag" > "$OUT/$tag.proxy.log" 2>&1 &
        PROXY_PID=$!
        wait_port "$PROXY_PORT"
        wrk -t"$WTHREADS" -c"$CONNS" -d"$WARMUP" "http://127.0.0.1:$PROXY_PORT/" \
            > "$OUT/$tag.warmup.txt" 2>&1
        load=$(cut -d' ' -f1 /proc/loadavg)
        thread_ticks "$PROXY_PID" > "$OUT/$tag.threads-before.txt"
        before=$(cpu_ticks "$PROXY_PID")
        perf_pid=
        if [ -n "${PERF_RECORD:-}" ]; then
            (sleep 1 && perf record -F 999 -g -p "$PROXY_PID" -o "$OUT/$tag.perf.data" \
                -- sleep 6 > "$OUT/$tag.perf-record.log" 2>&1) &
            perf_pid=$!
        fi
        wrk -t"$WTHREADS" -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$PROXY_PORT/" \
            > "$OUT/$tag.wrk.txt" 2>&1
        if [ -n "$perf_pid" ]; then
            wait "$perf_pid" || true
            perf report -i "$OUT/$tag.perf.data" --no-children --sort symbol --stdio -g none \
                2>/dev/null | head -60 | sed -E 's/ +- +- *$//; s/ +$//' > "$OUT/$tag.perf-report.txt" || true
            perf report -i "$OUT/$tag.perf.data" --no-children --sort comm --stdio -g none \
                2>/dev/null | grep '%' > "$OUT/$tag.perf-threads.txt" || true
            perf report -i "$OUT/$tag.perf.data" --no-children --sort dso,symbol --stdio -g none \
                2>/dev/null | grep '%' | sed -E 's/ +- +- *$//; s/ +$//' > "$OUT/$tag.perf-flat.txt" || true
        fi
        after=$(cpu_ticks "$PROXY_PID")
        thread_ticks "$PROXY_PID" > "$OUT/$tag.threads-after.txt"
        kill "$PROXY_PID"
        wait "$PROXY_PID" 2>/dev/null || true
        PROXY_PID=
        python3 - "$OUT/$tag.wrk.txt" "$round" "$timer" "$((after - before))" "$CLK_TCK" \
            "$load" >> "$OUT/results.tsv" <<'PY'
import re, sys
path, rnd, timer, ticks, clk, load = sys.argv[1:]
text = open(path).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
requests = int(re.search(r"(\d+) requests in", text).group(1))
value, unit = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", text, re.M).groups()
p99 = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errors += int(non2xx.group(1)) if non2xx else 0
cpu_ms = int(ticks) * 1000 / int(clk)
print(rnd, timer, f"{rps:.0f}", f"{p99:.2f}", ticks, requests,
      f"{cpu_ms / requests * 1000:.2f}", errors, load)
PY
        tail -n1 "$OUT/results.tsv"
    done
done
echo "load after: $(cat /proc/loadavg)" >> "$OUT/run-info.txt"

python3 - "$OUT" > "$OUT/table.txt" <<'PY'
import statistics, sys, collections, glob, os
out = sys.argv[1]
rows = [line.split() for line in open(os.path.join(out, "results.tsv"))][1:]
by = collections.OrderedDict()
for r in rows:
    by.setdefault(r[1], []).append(r)
def cell(vals, fmt):
    return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"
print(f"{'timer':<18} {'req/s median (min-max)':<28} {'p99 ms median (min-max)':<26} "
      f"{'CPU us/req median (min-max)':<32} errors")
for timer, rs in by.items():
    rps = [float(r[2]) for r in rs]; p99 = [float(r[3]) for r in rs]
    cpu = [float(r[6]) for r in rs]; err = sum(int(r[7]) for r in rs)
    print(f"{timer:<18} {cell(rps, '{:.0f}'):<28} {cell(p99, '{:.2f}'):<26} "
          f"{cell(cpu, '{:.2f}'):<32} {err}")
# Paired by round: each pair's ratio (median, min-max) and how many rounds the first won.
print()
print("paired by round (A/B ratio, median (min-max); rounds where A is better):")
rounds = collections.defaultdict(dict)
for r in rows:
    rounds[r[0]][r[1]] = r
names = list(by)
for i, a in enumerate(names):
    for b in names[i + 1:]:
        both = [k for k in rounds if a in rounds[k] and b in rounds[k]]
        for col, what, better in ((2, "req/s", 1), (6, "CPU/req", -1)):
            q = [float(rounds[k][a][col]) / float(rounds[k][b][col]) for k in both]
            wins = sum((x - 1) * better > 0 for x in q)
            print(f"  {a}/{b} {what}: {statistics.median(q):.2f} ({min(q):.2f}-{max(q):.2f}); "
                  f"{a} better in {wins}/{len(q)}")
# Per thread name: CPU ticks over the measured runs, summed over the rounds.
print()
print("proxy CPU per thread name over the measured runs (ticks, summed over rounds), and its")
print("threads' context switches (voluntary + involuntary) per 1,000 requests:")
for timer in by:
    per = collections.Counter()
    switches = [0, 0]
    requests = sum(int(r[5]) for r in by[timer])
    for before_path in sorted(glob.glob(os.path.join(out, f"r*-{timer}.threads-before.txt"))):
        before = {l.split()[0]: [int(x) for x in l.split()[2:]] for l in open(before_path)}
        for l in open(before_path.replace("threads-before", "threads-after")):
            tid, comm, *vals = l.split()
            was = before.get(tid, [0] * len(vals))
            per[comm] += int(vals[0]) - was[0]
            for i in (1, 2):
                if len(vals) > i and len(was) > i:
                    switches[i - 1] += int(vals[i]) - was[i]
    total = sum(per.values()) or 1
    print(f"  {timer}: " + ", ".join(f"{c} {t} ({100 * t / total:.1f}%)" for c, t in per.most_common()))
    if any(switches):
        print(f"  {timer}: switches per 1k requests: voluntary {1000 * switches[0] / requests:.1f}, "
              f"involuntary {1000 * switches[1] / requests:.1f}")
PY
cat "$OUT/table.txt"
