//! Model-based property tests: random sequences of insert, cancel, reset and clock moves,
//! checked step by step against a plain map of what should be pending.
//!
//! Each of the two properties runs 320 cases of 300 to 700 operations: about 320k
//! operations in total, on the default geometry and on a tiny one whose span is 64 ticks so
//! that the overflow list and cascades are exercised all the time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use corewheel::{TimerKey, Wheel};
use proptest::prelude::*;

const TICK: Duration = Duration::from_millis(1);
const TICK_NS: u64 = 1_000_000;

#[derive(Debug, Clone)]
enum Delay {
    /// Due this many nanoseconds after the current time.
    After(u64),
    /// Due this many nanoseconds before the current time.
    Before(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Delay),
    /// Cancels the `n % issued`-th key ever issued, pending or stale.
    Cancel(usize),
    Reset(usize, Delay),
    Advance(u64),
    /// Polls with an instant before the current time.
    PollBackwards(u64),
}

fn delay_ns() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0..3 * TICK_NS,
        4 => 0..300 * TICK_NS,
        2 => 0..(1 << 16) * TICK_NS,
        1 => 0..(1 << 40) * TICK_NS,
    ]
}

fn delay() -> impl Strategy<Value = Delay> {
    prop_oneof![
        9 => delay_ns().prop_map(Delay::After),
        1 => (0..500 * TICK_NS).prop_map(Delay::Before),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => delay().prop_map(Op::Insert),
        4 => any::<usize>().prop_map(Op::Cancel),
        4 => (any::<usize>(), delay()).prop_map(|(k, d)| Op::Reset(k, d)),
        5 => prop_oneof![
            4 => 0..3 * TICK_NS,
            4 => 0..200 * TICK_NS,
            2 => 0..70_000 * TICK_NS,
            1 => 0..(1 << 41) * TICK_NS,
        ]
        .prop_map(Op::Advance),
        1 => (1..100 * TICK_NS).prop_map(Op::PollBackwards),
    ]
}

/// What the wheel should hold: every pending timer's deadline, by the id it carries.
struct Model {
    origin: Instant,
    now: Instant,
    pending: HashMap<u64, Instant>,
    issued: Vec<(TimerKey, u64)>,
    next_id: u64,
}

impl Model {
    fn deadline(&self, delay: &Delay) -> Instant {
        match *delay {
            Delay::After(ns) => self.now + Duration::from_nanos(ns),
            Delay::Before(ns) => self
                .now
                .checked_sub(Duration::from_nanos(ns))
                .unwrap_or(self.now),
        }
    }

    /// The deadline rounded up to the tick, which is when the wheel may fire it.
    fn rounded(&self, deadline: Instant) -> Instant {
        // u128: hundreds of years of virtual time overflow a u64 of nanoseconds.
        let ns = deadline.saturating_duration_since(self.origin).as_nanos();
        let rounded_ns = ns.div_ceil(u128::from(TICK_NS)) * u128::from(TICK_NS);
        let secs = (rounded_ns / 1_000_000_000) as u64;
        self.origin + Duration::new(secs, (rounded_ns % 1_000_000_000) as u32)
    }
}

/// Polls at `poll_at` until nothing is due, checking each timer against the model's time
/// (the latest seen, since the wheel clamps a clock that runs backwards).
fn drain_and_check(wheel: &mut Wheel<u64>, m: &mut Model, poll_at: Instant) {
    while let Some(id) = wheel.poll_expired(poll_at) {
        let deadline = m
            .pending
            .remove(&id)
            .unwrap_or_else(|| panic!("timer {id} fired twice or after cancel"));
        assert!(deadline <= m.now, "timer {id} fired early");
    }
    for (id, &deadline) in &m.pending {
        assert!(
            deadline + TICK > m.now,
            "timer {id} is a full tick overdue and was not returned"
        );
    }
}

fn run(wheel: &mut Wheel<u64>, ops: &[Op]) {
    let origin = wheel.origin();
    let mut m = Model {
        origin,
        now: origin,
        pending: HashMap::new(),
        issued: Vec::new(),
        next_id: 0,
    };
    let trace = std::env::var_os("COREWHEEL_TRACE").is_some();
    for op in ops {
        if trace {
            eprintln!("{:?} now={:?} {op:?}", wheel, m.now - origin);
        }
        let work_before = wheel.link_operations();
        match op {
            Op::Insert(delay) => {
                let deadline = m.deadline(delay);
                let id = m.next_id;
                m.next_id += 1;
                let key = wheel.insert(deadline, id);
                m.issued.push((key, id));
                m.pending.insert(id, deadline);
                assert_eq!(wheel.link_operations() - work_before, 1, "insert is O(1)");
            }
            Op::Cancel(pick) => {
                if m.issued.is_empty() {
                    continue;
                }
                let (key, id) = m.issued[pick % m.issued.len()];
                let was_pending = m.pending.remove(&id).is_some();
                assert_eq!(wheel.cancel(key), was_pending.then_some(id));
                assert_eq!(
                    wheel.link_operations() - work_before,
                    u64::from(was_pending),
                    "cancel is O(1)"
                );
            }
            Op::Reset(pick, delay) => {
                if m.issued.is_empty() {
                    continue;
                }
                let (key, id) = m.issued[pick % m.issued.len()];
                let deadline = m.deadline(delay);
                let was_pending = m.pending.contains_key(&id);
                assert_eq!(wheel.reset(key, deadline), was_pending);
                if was_pending {
                    m.pending.insert(id, deadline);
                    assert_eq!(wheel.deadline(key), Some(m.rounded(deadline)));
                }
                // Pushing a deadline back costs no list work now; bringing it forward, or
                // moving a due timer back out, costs an unlink and a link.
                let work = wheel.link_operations() - work_before;
                assert!(
                    work == 0 || (was_pending && work == 2),
                    "reset is O(1): {work} list operations"
                );
            }
            Op::Advance(ns) => {
                m.now += Duration::from_nanos(*ns);
                let now = m.now;
                drain_and_check(wheel, &mut m, now);
            }
            Op::PollBackwards(ns) => {
                // The wheel treats an earlier instant as the latest one it has seen, so it
                // may hand out timers inserted with past deadlines since, but no others.
                let earlier = m
                    .now
                    .checked_sub(Duration::from_nanos(*ns))
                    .unwrap_or(origin);
                drain_and_check(wheel, &mut m, earlier);
            }
        }
        assert_eq!(wheel.len(), m.pending.len());
        // A timer already due may be reported at the last polled time rather than at its
        // own (past) deadline: either way, no later than now.
        let earliest = m.pending.values().map(|&d| m.rounded(d).max(m.now)).min();
        match (wheel.next_deadline(), earliest) {
            (None, None) => {}
            (Some(next), Some(earliest)) => assert!(
                next <= earliest,
                "next_deadline {:?} after the earliest deadline {:?}",
                next - origin,
                earliest - origin
            ),
            (next, earliest) => panic!("next_deadline {next:?} but earliest {earliest:?}"),
        }
    }
    // Everything left fires in the end, exactly once.
    m.now += Duration::from_secs(3600 * 24 * 365 * 40);
    while let Some(id) = wheel.poll_expired(m.now) {
        assert!(m.pending.remove(&id).is_some(), "timer {id} fired twice");
    }
    assert!(m.pending.is_empty(), "lost timers: {:?}", m.pending.keys());
    assert!(wheel.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(320))]

    #[test]
    fn default_geometry_matches_the_model(ops in prop::collection::vec(op(), 300..700)) {
        let mut wheel = Wheel::new(TICK, Instant::now());
        run(&mut wheel, &ops);
    }

    #[test]
    fn tiny_geometry_with_constant_overflow_matches_the_model(
        ops in prop::collection::vec(op(), 300..700),
    ) {
        let mut wheel = Wheel::builder()
            .tick(TICK)
            .slots_per_level(4)
            .levels(3)
            .build(Instant::now())
            .expect("valid geometry");
        run(&mut wheel, &ops);
    }
}
