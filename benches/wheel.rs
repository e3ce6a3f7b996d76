//! The wheel's hot paths at 1k and 1M live timers, with `std::collections::BinaryHeap`
//! beside it in the same run. Ends with a table of ratios read back from criterion's own
//! estimates.
//!
//! The heap has no cancel; it is given the usual lazy one (a tombstone bit per timer), which
//! is O(1) now but keeps the timer's memory until it would have fired.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use corewheel::{TimerKey, Wheel};
use criterion::{BenchmarkId, Criterion};
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

const SIZES: [(usize, &str); 2] = [(1_000, "1k"), (1_000_000, "1M")];
/// Operations timed between untimed clean-ups, so the live count stays near its label.
const BATCH: u64 = 1_000;
const THIRTY_S_US: u64 = 30_000_000;

/// A cheap deterministic stream of delays, uniform in 1 ms..30 s like request timeouts.
struct Delays(u64);

impl Delays {
    fn next(&mut self) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_micros(1_000 + self.0 % THIRTY_S_US)
    }
}

/// Deadlines drawn ahead of time, so the timed loops measure the timer structure rather
/// than random number generation and `Instant` arithmetic.
struct Deadlines {
    ring: Box<[Instant]>,
    next: usize,
}

impl Deadlines {
    const LEN: usize = 4096;

    fn new(origin: Instant, delays: &mut Delays) -> Self {
        Self {
            ring: (0..Self::LEN).map(|_| origin + delays.next()).collect(),
            next: 0,
        }
    }

    fn next(&mut self) -> Instant {
        self.next = (self.next + 1) % Self::LEN;
        self.ring[self.next]
    }
}

struct WheelFixture {
    wheel: Wheel<u64>,
    keys: Vec<TimerKey>,
    deadlines: Deadlines,
    origin: Instant,
    delays: Delays,
    /// The firing benchmark's clock, kept across criterion's samples so it never runs back.
    fire_now: Instant,
}

impl WheelFixture {
    fn new(live: usize) -> Self {
        let origin = Instant::now();
        let mut wheel = Wheel::builder()
            .capacity(live)
            .build(origin)
            .expect("default geometry");
        let mut delays = Delays(0x2545_F491_4F6C_DD1D);
        let keys = (0..live as u64)
            .map(|i| wheel.insert(origin + delays.next(), i))
            .collect();
        Self {
            wheel,
            keys,
            deadlines: Deadlines::new(origin, &mut delays),
            origin,
            delays,
            fire_now: origin + Duration::from_secs(31),
        }
    }

    fn deadline(&mut self) -> Instant {
        self.deadlines.next()
    }
}

struct HeapFixture {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    /// A tombstone per timer ever pushed, by id.
    cancelled: Vec<bool>,
    live: usize,
    deadlines: Deadlines,
    origin: Instant,
    delays: Delays,
    /// As in `WheelFixture`.
    fire_now: Instant,
}

impl HeapFixture {
    fn new(live: usize) -> Self {
        let origin = Instant::now();
        let mut delays = Delays(0x2545_F491_4F6C_DD1D);
        let heap = (0..live as u64)
            .map(|i| Reverse((origin + delays.next(), i)))
            .collect();
        Self {
            heap,
            cancelled: vec![false; live],
            live,
            deadlines: Deadlines::new(origin, &mut delays),
            origin,
            delays,
            fire_now: origin + Duration::from_secs(31),
        }
    }

    fn push(&mut self) -> u64 {
        let id = self.cancelled.len() as u64;
        self.cancelled.push(false);
        let deadline = self.deadlines.next();
        self.heap.push(Reverse((deadline, id)));
        id
    }

    /// Pops the `n` earliest entries, outside the timed region, to keep the heap's size.
    fn pop_untimed(&mut self, n: u64) {
        for _ in 0..n {
            self.heap.pop();
        }
    }
}

/// Runs `iters` operations in batches of at most `BATCH`. Each call of `batch` does `n`
/// operations and returns only the time they took, leaving out whatever it does afterwards
/// to restore the live count.
fn batched(iters: u64, mut batch: impl FnMut(u64) -> Duration) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        total += batch(n);
        left -= n;
    }
    total
}

/// Runs one operation, at one live count, for both subjects.
fn pair(
    c: &mut Criterion,
    group_name: &str,
    mut wheel_op: impl FnMut(&mut WheelFixture, u64) -> Duration,
    mut heap_op: impl FnMut(&mut HeapFixture, u64) -> Duration,
) {
    let mut group = c.benchmark_group(group_name);
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(20);
    for (live, label) in SIZES {
        let mut f = WheelFixture::new(live);
        group.bench_function(BenchmarkId::new("corewheel", label), |b| {
            b.iter_custom(|iters| wheel_op(&mut f, iters))
        });
        drop(f);
        let mut h = HeapFixture::new(live);
        group.bench_function(BenchmarkId::new("binary_heap", label), |b| {
            b.iter_custom(|iters| heap_op(&mut h, iters))
        });
    }
    group.finish();
}

fn insert(c: &mut Criterion) {
    let mut added = Vec::with_capacity(BATCH as usize);
    pair(
        c,
        "insert",
        |f, iters| {
            batched(iters, |n| {
                let start = Instant::now();
                for i in 0..n {
                    let deadline = f.deadline();
                    added.push(f.wheel.insert(deadline, i));
                }
                let timed = start.elapsed();
                for key in added.drain(..) {
                    f.wheel.cancel(key);
                }
                timed
            })
        },
        |h, iters| {
            batched(iters, |n| {
                let start = Instant::now();
                for _ in 0..n {
                    black_box(h.push());
                }
                let timed = start.elapsed();
                h.pop_untimed(n);
                timed
            })
        },
    );
}

fn cancel(c: &mut Criterion) {
    pair(
        c,
        "cancel",
        |f, iters| {
            let mut pick = Delays(0x9E37_79B9_7F4A_7C15);
            let mut victims = Vec::with_capacity(BATCH as usize);
            batched(iters, |n| {
                victims.clear();
                victims.extend((0..n).map(|_| (pick.next().as_micros() as usize) % f.keys.len()));
                let start = Instant::now();
                for &v in &victims {
                    black_box(f.wheel.cancel(f.keys[v]));
                }
                let timed = start.elapsed();
                for &v in &victims {
                    let deadline = f.deadline();
                    f.keys[v] = f.wheel.insert(deadline, v as u64);
                }
                timed
            })
        },
        |h, iters| {
            let mut pick = Delays(0x9E37_79B9_7F4A_7C15);
            let mut victims = Vec::with_capacity(BATCH as usize);
            batched(iters, |n| {
                let live = h.cancelled.len();
                victims.clear();
                victims.extend((0..n).map(|_| (pick.next().as_micros() as usize) % live));
                let start = Instant::now();
                for &v in &victims {
                    h.cancelled[v] = true;
                }
                let timed = start.elapsed();
                for &v in &victims {
                    h.cancelled[v] = false;
                }
                timed
            })
        },
    );
}

fn reset(c: &mut Criterion) {
    pair(
        c,
        "reset",
        |f, iters| {
            let mut pick = Delays(0x9E37_79B9_7F4A_7C15);
            let start = Instant::now();
            for _ in 0..iters {
                let v = (pick.next().as_micros() as usize) % f.keys.len();
                let deadline = f.deadline();
                black_box(f.wheel.reset(f.keys[v], deadline));
            }
            start.elapsed()
        },
        |h, iters| {
            let mut pick = Delays(0x9E37_79B9_7F4A_7C15);
            batched(iters, |n| {
                let live = h.cancelled.len();
                let start = Instant::now();
                for _ in 0..n {
                    let v = (pick.next().as_micros() as usize) % live;
                    h.cancelled[v] = true;
                    black_box(h.push());
                }
                let timed = start.elapsed();
                h.pop_untimed(n);
                timed
            })
        },
    );
}

/// The idle-timeout shape: every reset pushes a connection's deadline back to a moving
/// "now" plus 30 s, so the new deadline is always the latest yet.
fn reset_later(c: &mut Criterion) {
    let idle = Duration::from_secs(30);
    pair(
        c,
        "reset_later",
        |f, iters| {
            let mut pick = Delays(0x9E37_79B9_7F4A_7C15);
            let base = f.origin + idle;
            let start = Instant::now();
            for i in 0..iters {
                let v = (pick.next().as_micros() as usize) % f.keys.len();
                let deadline = base + Duration::from_nanos(i);
                black_box(f.wheel.reset(f.keys[v], deadline));
            }
            start.elapsed()
        },
        |h, iters| {
            let mut pick = Delays(0x9E37_79B9_7F4A_7C15);
            let base = h.origin + idle;
            batched(iters, |n| {
                let live = h.cancelled.len();
                let start = Instant::now();
                for i in 0..n {
                    let v = (pick.next().as_micros() as usize) % live;
                    h.cancelled[v] = true;
                    let id = h.cancelled.len() as u64;
                    h.cancelled.push(false);
                    h.heap.push(Reverse((base + Duration::from_nanos(i), id)));
                }
                let timed = start.elapsed();
                h.pop_untimed(n);
                timed
            })
        },
    );
}

fn insert_cancel(c: &mut Criterion) {
    pair(
        c,
        "insert_cancel",
        |f, iters| {
            let start = Instant::now();
            for i in 0..iters {
                let deadline = f.deadline();
                let key = f.wheel.insert(deadline, i);
                black_box(f.wheel.cancel(key));
            }
            start.elapsed()
        },
        |h, iters| {
            batched(iters, |n| {
                let start = Instant::now();
                for _ in 0..n {
                    let id = h.push();
                    h.cancelled[id as usize] = true;
                }
                let timed = start.elapsed();
                h.pop_untimed(n);
                timed
            })
        },
    );
}

/// Arm a timer and cancel the one armed `live` operations earlier: a proxy whose responses
/// arrive in order. The cancelled node is cold at 1M live, unlike in `insert_cancel`.
fn insert_cancel_oldest(c: &mut Criterion) {
    pair(
        c,
        "insert_cancel_oldest",
        |f, iters| {
            let live = f.keys.len();
            let mut oldest = 0;
            let start = Instant::now();
            for i in 0..iters {
                let deadline = f.deadline();
                let key = f.wheel.insert(deadline, i);
                black_box(f.wheel.cancel(std::mem::replace(&mut f.keys[oldest], key)));
                oldest = (oldest + 1) % live;
            }
            start.elapsed()
        },
        |h, iters| {
            batched(iters, |n| {
                let start = Instant::now();
                for _ in 0..n {
                    let id = h.push() as usize;
                    h.cancelled[id - h.live] = true;
                }
                let timed = start.elapsed();
                h.pop_untimed(n);
                timed
            })
        },
    );
}

/// Hand out due timers. Each batch is replaced, untimed, by as many new ones, so the live
/// count stays at its label; the poll time jumps 31 s whenever nothing is due.
fn fire(c: &mut Criterion) {
    pair(
        c,
        "fire",
        |f, iters| {
            let mut now = f.fire_now;
            let total = batched(iters, |n| {
                let start = Instant::now();
                let mut fired = 0;
                while fired < n {
                    match f.wheel.poll_expired(now) {
                        Some(v) => {
                            black_box(v);
                            fired += 1;
                        }
                        None => now += Duration::from_secs(31),
                    }
                }
                let timed = start.elapsed();
                for i in 0..n {
                    let deadline = now + f.delays.next();
                    f.wheel.insert(deadline, i);
                }
                timed
            });
            f.fire_now = now;
            total
        },
        |h, iters| {
            let mut now = h.fire_now;
            let total = batched(iters, |n| {
                let start = Instant::now();
                let mut fired = 0;
                while fired < n {
                    match h.heap.peek() {
                        Some(Reverse((deadline, _))) if *deadline <= now => {
                            if let Some(Reverse((_, id))) = h.heap.pop() {
                                black_box(h.cancelled[id as usize]);
                            }
                            fired += 1;
                        }
                        _ => now += Duration::from_secs(31),
                    }
                }
                let timed = start.elapsed();
                for i in 0..n {
                    let deadline = now + h.delays.next();
                    h.heap.push(Reverse((deadline, i)));
                }
                timed
            });
            h.fire_now = now;
            total
        },
    );
}

/// Criterion's mean estimate for one benchmark, in nanoseconds, if this run produced one.
fn mean_ns(group: &str, subject: &str, label: &str) -> Option<f64> {
    let path = format!("target/criterion/{group}/{subject}/{label}/new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

fn print_ratios() {
    println!(
        "\n{:<22} {:>5} {:>12} {:>14} {:>9}",
        "operation", "live", "corewheel", "BinaryHeap", "ratio"
    );
    for group in [
        "insert",
        "cancel",
        "reset",
        "reset_later",
        "insert_cancel",
        "insert_cancel_oldest",
        "fire",
    ] {
        for (_, label) in SIZES {
            if let (Some(w), Some(h)) = (
                mean_ns(group, "corewheel", label),
                mean_ns(group, "binary_heap", label),
            ) {
                println!(
                    "{group:<22} {label:>5} {w:>9.1} ns {h:>11.1} ns {:>8.2}x",
                    h / w
                );
            }
        }
    }
    println!("(ratio > 1: corewheel is faster; the heap's cancel is a lazy tombstone)");
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    insert(&mut c);
    cancel(&mut c);
    reset(&mut c);
    reset_later(&mut c);
    insert_cancel(&mut c);
    insert_cancel_oldest(&mut c);
    fire(&mut c);
    c.final_summary();
    // `cargo test` runs benches once each without `--bench`: there are no fresh estimates
    // to compare then.
    if std::env::args().any(|a| a == "--bench") {
        print_ratios();
    }
}
