//! Model-based property tests: random sequences of insert, cancel, reset and clock moves,
//! checked step by step against a plain map of what should be pending.
//!
//! Each of the three properties runs 320 cases of 300 to 700 operations, about 480k
//! operations in total: on the default geometry, on a tiny one whose span is 64 ticks so
//! that the overflow list and cascades are exercised all the time, and on 64 levels of 2
//! slots with a 7 ns tick, whose span is the whole u64 tick range.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use corewheel::{TimerKey, Wheel};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// The unit the generated delays are scaled in (the default tick).
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
    /// Polls once at the current time without draining, leaving a slot half handed out.
    PollOnce,
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
        2 => Just(Op::PollOnce),
    ]
}

/// What the wheel should hold: every pending timer's deadline, by the id it carries.
struct Model {
    origin: Instant,
    tick: Duration,
    now: Instant,
    /// The latest instant the wheel has been polled with, which is its idea of the time.
    polled: Option<Instant>,
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
        let tick_ns = self.tick.as_nanos();
        let rounded_ns = ns.div_ceil(tick_ns) * tick_ns;
        let secs = (rounded_ns / 1_000_000_000) as u64;
        self.origin + Duration::new(secs, (rounded_ns % 1_000_000_000) as u32)
    }
}

/// Polls once at `poll_at` and checks what came out against the wheel's idea of the time
/// (the latest instant polled, since it clamps a clock that runs backwards).
fn poll_and_check(wheel: &mut Wheel<u64>, m: &mut Model, poll_at: Instant) -> bool {
    let effective = m.polled.map_or(poll_at, |p| p.max(poll_at));
    m.polled = Some(effective);
    let Some(id) = wheel.poll_expired(poll_at) else {
        return false;
    };
    let deadline = m
        .pending
        .remove(&id)
        .unwrap_or_else(|| panic!("timer {id} fired twice or after cancel"));
    assert!(deadline <= effective, "timer {id} fired early");
    true
}

/// Polls at `poll_at` until nothing is due, then checks that nothing a full tick overdue
/// was left behind and that the wheel's next deadline lies ahead.
fn drain_and_check(wheel: &mut Wheel<u64>, m: &mut Model, poll_at: Instant) {
    while poll_and_check(wheel, m, poll_at) {}
    let effective = m.polled.unwrap_or(poll_at);
    for (id, &deadline) in &m.pending {
        // The wheel's time begins at its origin: an earlier deadline is due there.
        assert!(
            deadline.max(m.origin) + m.tick > effective,
            "timer {id} is a full tick overdue and was not returned"
        );
    }
    if let Some(next) = wheel.next_deadline() {
        assert!(next > effective, "next_deadline is not ahead after a drain");
    }
}

fn run(wheel: &mut Wheel<u64>, ops: &[Op]) {
    let origin = wheel.origin();
    let mut m = Model {
        origin,
        tick: wheel.tick(),
        now: origin,
        polled: None,
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
            Op::PollOnce => {
                let now = m.now;
                poll_and_check(wheel, &mut m, now);
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
    let now = m.now;
    drain_and_check(wheel, &mut m, now);
    assert!(m.pending.is_empty(), "lost timers: {:?}", m.pending.keys());
    assert!(wheel.is_empty());
}

proptest! {
    // Regressions beside this file (model.proptest-regressions), not in a folder beside the
    // binary's main.rs (proptest's default).
    #![proptest_config(ProptestConfig {
        cases: 320,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions"
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn default_geometry_matches_the_model(ops in prop::collection::vec(op(), 300..700)) {
        let mut wheel = Wheel::new(Duration::from_nanos(TICK_NS), Instant::now());
        run(&mut wheel, &ops);
    }

    #[test]
    fn tiny_geometry_with_constant_overflow_matches_the_model(
        ops in prop::collection::vec(op(), 300..700),
    ) {
        let mut wheel = Wheel::builder()
            .tick(Duration::from_nanos(TICK_NS))
            .slots_per_level(4)
            .levels(3)
            .build(Instant::now())
            .expect("valid geometry");
        run(&mut wheel, &ops);
    }

    #[test]
    fn two_slot_levels_spanning_all_64_bits_with_a_7ns_tick_match_the_model(
        ops in prop::collection::vec(op(), 300..700),
    ) {
        let mut wheel = Wheel::builder()
            .tick(Duration::from_nanos(7))
            .slots_per_level(2)
            .levels(64)
            .build(Instant::now())
            .expect("valid geometry");
        run(&mut wheel, &ops);
    }
}
