//! The due path: lookahead pacing (`move_ahead_tick` beside `next_tick`), the pre-cascade
//! of level-2+ slots into the past slots of the level below (`pre_cascade`,
//! `Geometry::slot_start`'s next rotation, `next_expiration`'s "current coarse slot"), and
//! the batched interleaved claim (`poll_batch`, `take_interleaved`, the engine's
//! `claim_due`).
//!
//! Every wheel test here checks, against a model, that no timer fires early, none fires
//! twice or after a cancel, none is left a tick overdue after a drain, and that
//! `next_deadline` is never later than the earliest pending deadline (rounded up to the
//! tick) and lies ahead of the last poll after a drain (so a loop sleeping until it cannot
//! spin in place). The storms are larger than the wheel's 1024-timer move budget, so that
//! moves ahead of time are split across polls; they sit on level-2 and level-3 boundaries,
//! in the last finer slot (what pre-cascade leaves behind), and are cancelled, reset
//! earlier and reset later (lazily, staying in moved or left-behind slots) between polls
//! that step a tick, jump across boundaries, run backwards or stop half way.
//!
//! The engine tests drive a manual clock across the same boundaries with cancels and
//! resets racing from other threads, and check exactly-once, nothing lost, `stats()` and
//! `nodes_in_use()` after shutdown. All randomness is seeded.
//!
//! Four tests guard faults since fixed (the comments marked "Why:" describe them): a stale
//! count of what pre-cascade had left made an empty wheel ask for wake-ups; timers filed
//! into a slot after pre-cascade's first look, or moved in by the level above, were
//! cascaded in one poll at the boundary; and a full-span geometry asked for a wake-up for
//! timers that never fire.

use crate::support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::Rng;
use corewheel::{Clock, PendingTimers, Wheel};

use crate::support::wheel_harness::Harness;

impl Harness {
    /// A random storm of `n` timers around boundary tick `b` of level `level`.
    fn storm(&mut self, rng: &mut Rng, b: u64, level: u32, n: u64) {
        let w = self.width(level);
        let finer = self.width(level.saturating_sub(1));
        let block = self.width(1);
        let shape = rng.below(7);
        for _ in 0..n {
            let t = match shape {
                // Spread over the whole coarse slot.
                0 => b + rng.below(w),
                // All in its first block.
                1 => b + rng.below(block),
                // All in its last finer slot: what pre-cascade leaves behind.
                2 => b + (self.slots - 1) * finer + rng.below(finer),
                // Exactly on the boundary.
                3 => b,
                // Just before it: the slot elapsed crosses while moves are under way.
                4 => b.saturating_sub(1 + rng.below(finer)).max(1),
                // Straddling it, a few ticks either side.
                5 => (b + rng.below(8)).saturating_sub(4).max(1),
                // A mix of all levels' slots near it.
                _ => b + rng.below(w.saturating_mul(2)),
            };
            self.insert_tick(t);
        }
    }

    fn random_deadline_near(&mut self, rng: &mut Rng, b: u64, level: u32) -> Instant {
        let now = self.now_tick();
        let w = self.width(level);
        let t = match rng.below(8) {
            // Earlier: due at once or soon.
            0 => now.saturating_sub(rng.below(3)).max(1),
            1 => now + 1 + rng.below(4),
            // Later within the same coarse slot.
            2 => b + rng.below(w),
            // Later by a whole coarse slot or two: out of the slot being moved.
            3 => b + w + rng.below(w),
            // Far later, maybe past the span.
            4 => now + rng.below(self.width(self.levels.min(12)).max(2)),
            // Into the last finer slot.
            5 => b + w - 1 - rng.below(self.width(level - 1)),
            // Across the next boundary.
            6 => b + rng.below(8),
            _ => b.saturating_sub(rng.below(8)).max(now + 1),
        };
        self.at(t)
    }

    /// A random mix of the moves that attack the boundary `b` of `level`.
    fn mix(&mut self, rng: &mut Rng, b: u64, level: u32, rounds: usize) {
        for _ in 0..rounds {
            match rng.below(12) {
                0 | 1 => {
                    let n = rng.range(1, 300);
                    for _ in 0..n {
                        let pick = rng.next() as usize;
                        self.cancel(pick);
                    }
                }
                2 | 3 => {
                    let n = rng.range(1, 300);
                    for _ in 0..n {
                        let pick = rng.next() as usize;
                        let d = self.random_deadline_near(rng, b, level);
                        self.reset(pick, d);
                    }
                }
                4 => {
                    let n = rng.range(1, 200);
                    for _ in 0..n {
                        let d = self.random_deadline_near(rng, b, level);
                        self.insert(d);
                    }
                }
                5 | 6 => self.follow_next_deadline(rng.range(1, 40), None),
                7 => self.step_ticks(rng.range(1, 20)),
                8 => {
                    // A jump to just before, on, or past the boundary.
                    let now = self.now_tick();
                    let w = self.width(level);
                    let target = match rng.below(4) {
                        0 => b.saturating_sub(rng.below(self.width(level - 1))),
                        1 => b,
                        2 => b + rng.below(w),
                        _ => b + w + rng.below(w),
                    };
                    let at = self.at(target.max(now));
                    self.drain(at);
                }
                9 => {
                    // Backwards: an older reading.
                    let now = self.now_tick();
                    let at = self.at(now.saturating_sub(rng.below(500)).max(1));
                    self.drain(at);
                }
                10 => {
                    // Half way: one poll, a slot left partly handed out.
                    let at = self.at(self.now_tick() + rng.below(3));
                    for _ in 0..rng.range(1, 50) {
                        self.poll_once(at);
                    }
                    self.check_next_deadline();
                }
                _ => {
                    let at = self.at(self.now_tick() + rng.below(3));
                    self.drain(at);
                }
            }
            self.check_next_deadline();
        }
    }
}

/// Runs the storm scenario on a harness: for each round, a boundary of `level` ahead,
/// a storm there, and a mix of moves attacking it while time crosses it.
fn storm_rounds(h: &mut Harness, rng: &mut Rng, level: u32, rounds: usize, storm: (u64, u64)) {
    for _ in 0..rounds {
        let w = h.width(level);
        let now = h.now_tick();
        let b = (now / w + 1 + rng.below(2)) * w;
        // Get near the boundary first without a drain missing anything.
        let lead = h.width(level - 1) * rng.range(1, 3);
        let approach = b.saturating_sub(lead).max(now);
        let n = rng.range(storm.0, storm.1);
        h.storm(rng, b, level, n);
        if rng.percent(50) {
            h.follow_next_deadline(u64::MAX, Some(h.at(approach)));
        } else {
            let at = h.at(approach);
            h.drain(at);
        }
        h.mix(rng, b, level, 40);
        // Cross the boundary and the coarse slot, polled as a sleeper would.
        let end = h.at(b + w + 1);
        h.follow_next_deadline(200_000, Some(end));
    }
    h.finish();
}

// Why: the level-2 pre-cascade and lookahead pacing only split their work for slots of
// more than 1024 timers; storms of 1.1k-5k timers on 4096-tick boundaries, with cancels,
// lazy and eager resets and jumps between polls, on the default geometry.
#[test]
fn level2_storms_match_the_model() {
    for seed in 0..40 {
        let mut rng = Rng(0xD0E_0002 + seed);
        let mut h = Harness::default_geometry();
        storm_rounds(&mut h, &mut rng, 2, 3, (1100, 5000));
    }
}

// Why: level-3 boundaries (262,144 ticks) chain two pre-cascades (level 3 into level 2's
// past slots while level 2's next slot 0 moves into level 1's): storms there, with the
// same attack mix.
#[test]
fn level3_storms_match_the_model() {
    for seed in 0..16 {
        let mut rng = Rng(0xD0E_0003 + seed);
        let mut h = Harness::default_geometry();
        storm_rounds(&mut h, &mut rng, 3, 2, (1100, 4000));
    }
}

// Why: small geometries make every boundary a multi-level one and put pre-cascade next
// to the overflow list (4 slots x 3 levels spans 64 ticks; 2 slots x 3 levels spans 8;
// 2 slots x 64 levels spans every tick; 2 levels have a lookahead but no level 2).
#[test]
fn small_geometries_with_storms_match_the_model() {
    let shapes: [(usize, usize, u64); 8] = [
        (2, 2, 1_000_000),
        (2, 3, 1_000_000),
        (4, 3, 1_000_000),
        (4, 4, 1_000_000),
        (8, 3, 1_000_000),
        (2, 64, 7),
        (4, 32, 1),
        (16, 4, 1_000),
    ];
    for (i, &(slots, levels, tick_ns)) in shapes.iter().enumerate() {
        for seed in 0..8 {
            let mut rng = Rng(0x5_4A11 + 100 * i as u64 + seed);
            let mut h = Harness::with_geometry(slots, levels, Duration::from_nanos(tick_ns));
            let level = if levels >= 3 {
                rng.range(2, levels.min(5) as u64) as u32
            } else {
                1
            };
            let level = level.max(1);
            if level == 1 {
                // No level 2: attack the lookahead's block boundary instead.
                storm_rounds_level1(&mut h, &mut rng);
            } else {
                storm_rounds(&mut h, &mut rng, level, 2, (1100, 3000));
            }
        }
    }
}

/// [`storm_rounds`] for a two-level wheel, whose coarse slots are level 1.
fn storm_rounds_level1(h: &mut Harness, rng: &mut Rng) {
    for _ in 0..3 {
        let w = h.width(1);
        let b = (h.now_tick() / w + 1) * w;
        let n = rng.range(1100, 3000);
        for _ in 0..n {
            let t = b + rng.below(w * 3);
            h.insert_tick(t);
        }
        h.mix(rng, b, 1, 30);
        let end = h.at(b + 4 * w);
        h.follow_next_deadline(100_000, Some(end));
    }
    h.finish();
}

// Why: a loop that only ever polls at `next_deadline` is how the wheel is meant to be
// driven; it must fire everything on time, never see the deadline go backwards or stall,
// and not wake much more than once per distinct deadline plus the paced moves.
#[test]
fn a_next_deadline_driver_fires_everything_on_time_without_stalling() {
    let mut rng = Rng(0x00DE_AD11);
    let mut h = Harness::default_geometry();
    // Storms on three level-2 boundaries and one level-3 boundary, plus a sprinkle.
    let mut distinct = BTreeSet::new();
    for k in 1..=3_u64 {
        for _ in 0..3000 {
            let t = k * 4096 + rng.below(4096);
            distinct.insert(t);
            h.insert_tick(t);
        }
    }
    for _ in 0..5000 {
        let t = 262_144 + rng.below(262_144);
        distinct.insert(t);
        h.insert_tick(t);
    }
    let mut last = None;
    let mut wakes = 0_u64;
    while let Some(next) = h.wheel.next_deadline() {
        assert!(
            last.is_none_or(|l| next > l),
            "next_deadline went backwards"
        );
        last = Some(next);
        h.drain(next);
        wakes += 1;
        assert!(wakes < 1_000_000, "the driver never ends");
    }
    assert!(h.pending.is_empty());
    let idle = h.idle_polls;
    // Each >1024-timer coarse slot may ask for up to a block's worth of paced wakes per
    // level it passes through.
    assert!(
        idle <= 64 * 20,
        "{idle} wakes that fired nothing ({wakes} wakes, {} distinct deadlines)",
        distinct.len()
    );
}

// Why: a storm entirely in the last level-1 slot of the next level-2 slot is what
// pre-cascade leaves behind ("residual"): it must be looked at once, not walked again on
// every poll, and must not make the wheel ask for a wake-up every tick.
#[test]
fn a_residual_storm_is_walked_once_and_not_woken_for_every_tick() {
    let mut h = Harness::default_geometry();
    // Level-2 slot 1 is [4096, 8192); its last level-1 slot is [8128, 8192).
    for i in 0..20_000_u64 {
        h.insert_tick(8128 + i % 64);
    }
    let start_ops = h.wheel.link_operations();
    // Sleep until the level-2 slot's last finer slot, the way a driver would.
    h.follow_next_deadline(u64::MAX, Some(h.at(8127)));
    let ops = h.wheel.link_operations() - start_ops;
    // Each timer: at most one look by pre-cascade (sent back), one cascade to level 1 at
    // 4096, one move into the lookahead.
    assert!(
        ops <= 3 * 20_000 + 64,
        "{ops} list operations before any of 20k timers is due"
    );
    assert!(
        h.idle_polls <= 200,
        "{} idle wakes before the storm's block",
        h.idle_polls
    );
    h.finish();
    let total = h.wheel.link_operations() - start_ops;
    assert!(
        total <= 6 * 20_000,
        "{total} list operations for 20k timers"
    );
}

// Why: timers pushed back (lazily) out of a slot being moved ahead of time are sent back
// to the slot's end or re-filed; a storm where every timer is pushed back again and
// again must not turn into a poll that walks the same timers forever or a wake-up every
// tick.
#[test]
fn repeatedly_pushed_back_storm_costs_bounded_work() {
    let mut h = Harness::default_geometry();
    let n = 5000_u64;
    for i in 0..n {
        h.insert_tick(4096 + i % 4096);
    }
    let ops0 = h.wheel.link_operations();
    let polls0 = h.polls;
    // Ten times: sleep towards the slot, then push every timer back one level-2 slot.
    for round in 1..=10_u64 {
        let target = h.at(round * 4096 - 2);
        h.follow_next_deadline(u64::MAX, Some(target));
        h.drain(target);
        for pick in 0..n as usize {
            let t = (round + 1) * 4096 + (pick as u64 % 4096);
            let at = h.at(t);
            h.reset(pick, at);
        }
    }
    let ops = h.wheel.link_operations() - ops0;
    let polls = h.polls - polls0;
    assert!(
        ops <= 10 * 8 * n,
        "{ops} list operations for 10 rounds of {n} pushed-back timers"
    );
    assert!(polls <= 10 * 300, "{polls} polls over 10 rounds");
    h.finish();
}

// Why: `next_deadline` is documented as `None` when the wheel holds only timers beyond
// the tick range. On a geometry whose span is the whole u64 tick range (2 slots x 64
// levels), such timers are filed on the top level rather than the overflow list, and
// more than 1024 of them make `pre_cascade_tick` ask for a paced wake-up.
#[test]
fn only_never_firing_timers_give_no_next_deadline_on_a_full_span_geometry() {
    let origin = Instant::now();
    let mut wheel: Wheel<u32> = Wheel::builder()
        .tick(Duration::from_nanos(1))
        .slots_per_level(2)
        .levels(64)
        .build(origin)
        .unwrap();
    // 2^64 ns is 584 years: 1000 years is beyond the tick range.
    let never = origin + Duration::from_secs(1000 * 365 * 86_400);
    for i in 0..2000 {
        wheel.insert(never, i);
    }
    assert_eq!(wheel.poll_expired(origin), None);
    assert_eq!(
        wheel.next_deadline(),
        None,
        "only timers beyond the tick range are pending"
    );
}

// Why: the same, on the default geometry, must already hold (they go to overflow); a
// regression guard beside the fault above.
#[test]
fn only_never_firing_timers_give_no_next_deadline_on_the_default_geometry() {
    let origin = Instant::now();
    let mut wheel: Wheel<u32> = Wheel::new(Duration::from_millis(1), origin);
    let never = origin + Duration::from_secs(1_000_000_000 * 365 * 86_400);
    for i in 0..2000 {
        wheel.insert(never, i);
    }
    assert_eq!(wheel.poll_expired(origin), None);
    assert_eq!(wheel.next_deadline(), None);
}

// Why: cancelling a whole storm after pre-cascade has moved part of it (and the lookahead
// part of that) must leave nothing that asks for wake-ups, and an empty wheel.
// Guards a fault since fixed (a stale count asked for wake-ups).
#[test]
fn cancelling_a_half_moved_storm_leaves_no_work() {
    let mut h = Harness::default_geometry();
    for i in 0..10_000_u64 {
        h.insert_tick(4096 + (i * 7) % 4096);
    }
    // Into level-1 slot 63 of level-2 slot 0: pre-cascade is under way.
    let at = h.at(4096 - 60);
    h.drain(at);
    h.step_ticks(3);
    for pick in 0..10_000 {
        h.cancel(pick);
    }
    assert!(h.wheel.is_empty());
    assert_eq!(
        h.wheel.next_deadline(),
        None,
        "an empty wheel asks for no wake-up"
    );
}

// Why: polls with an older reading mid-pre-cascade must not move `elapsed` backwards or
// re-run moves (debug assertions in `poll` and `coarse_candidates` would fire).
#[test]
fn backwards_polls_mid_pre_cascade_are_harmless() {
    let mut rng = Rng(0xBAC4);
    let mut h = Harness::default_geometry();
    for _ in 0..6000 {
        let t = 8192 + rng.below(4096);
        h.insert_tick(t);
    }
    let mut t = 8192 - 64;
    while t < 8192 + 200 {
        let at = h.at(t);
        h.drain(at);
        let back = h.at(t.saturating_sub(rng.below(5000)).max(1));
        h.drain(back);
        t += rng.range(1, 5);
    }
    h.finish();
}

// Why: a single poll that jumps from mid-pre-cascade far across several level-2 and a
// level-3 boundary must hand out everything due, in one go, and nothing early.
#[test]
fn huge_jumps_from_mid_pre_cascade_fire_everything_due() {
    let mut rng = Rng(0x1A4B);
    for jump in [1_u64, 63, 64, 65, 4096, 4097, 262_144, 300_000, 1 << 30] {
        let mut h = Harness::default_geometry();
        for _ in 0..4000 {
            let t = 4096 + rng.below(3 * 4096);
            h.insert_tick(t);
        }
        for _ in 0..2000 {
            let t = 262_144 + rng.below(262_144);
            h.insert_tick(t);
        }
        let at = h.at(4096 - 40);
        h.drain(at);
        h.step_ticks(5);
        let target = h.at(h.now_tick() + jump);
        h.drain(target);
        h.finish();
    }
}

// Why: the engine now claims up to 64 due timers at a time, walking up to 16 due slots in
// turn, and wakes early to move storms ahead of time. A burst across a level-2 and a
// level-3 boundary, with cancels and resets (earlier and later) racing from other
// threads while the manual clock crosses the boundaries: every timer fires once or is
// cancelled, none early against its last confirmed deadline, stats agree, and every node
// is back after shutdown.
#[test]
fn engine_bursts_across_boundaries_with_racing_cancels_and_resets() {
    support::within(Duration::from_secs(120), "engine burst", || {
        let (engine, clock) = support::manual(2);
        let engine = Arc::new(engine);
        let start = clock.now();
        let n = 12_000_usize;
        let fired_at: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let fired_count: Arc<Vec<AtomicUsize>> =
            Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
        // The deadline (ms since start) the timer must not fire before: its first one,
        // then each confirmed reset's.
        let floor_ms: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let mut rng = Rng(0xE261);
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            let ms = match i % 3 {
                0 => 4096 - 32 + rng.below(4096 + 64),
                1 => 262_144 - 64 + rng.below(200),
                _ => 8192 + rng.below(64),
            };
            floor_ms[i].store(ms, Ordering::SeqCst);
            let fired_at = Arc::clone(&fired_at);
            let fired_count = Arc::clone(&fired_count);
            let c = clock.clone();
            let h = engine
                .schedule_at(start + Duration::from_millis(ms), move || {
                    let now = (c.now() - start).as_millis() as u64;
                    fired_at[i].store(now, Ordering::SeqCst);
                    fired_count[i].fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            handles.push(h);
        }
        let handles = Arc::new(handles);
        let cancelled: Arc<Vec<AtomicBool>> =
            Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut racers = Vec::new();
        for r in 0..2_u64 {
            let engine = Arc::clone(&engine);
            let handles = Arc::clone(&handles);
            let cancelled = Arc::clone(&cancelled);
            let floor_ms = Arc::clone(&floor_ms);
            let stop = Arc::clone(&stop);
            let clock = clock.clone();
            racers.push(std::thread::spawn(move || {
                let mut rng = Rng(0xACE + r);
                // Each racer owns the timers of its parity, so its confirmed resets are
                // the last word on their deadlines.
                while !stop.load(Ordering::SeqCst) {
                    let i = (rng.below(n as u64 / 2) * 2 + r) as usize;
                    let now_ms = (clock.now() - start).as_millis() as u64;
                    match rng.below(4) {
                        0 => {
                            if engine.cancel(handles[i]) {
                                cancelled[i].store(true, Ordering::SeqCst);
                            }
                        }
                        1 => {
                            // Later: within the same coarse slot, or the next.
                            let ms = floor_ms[i].load(Ordering::SeqCst) + rng.below(5000);
                            if engine.reset_at(handles[i], start + Duration::from_millis(ms)) {
                                floor_ms[i].store(ms, Ordering::SeqCst);
                            }
                        }
                        _ => {
                            // Earlier: a few ms from now.
                            let ms = now_ms + rng.below(8);
                            if engine.reset_at(handles[i], start + Duration::from_millis(ms)) {
                                floor_ms[i].store(ms, Ordering::SeqCst);
                            }
                        }
                    }
                    if rng.percent(10) {
                        std::thread::yield_now();
                    }
                }
            }));
        }
        // Drive the clock: jump to near each boundary, then step a ms at a time.
        let mut ms = 0_u64;
        let windows = [(4096 - 200, 8192 + 300), (262_144 - 5000, 262_144 + 6000)];
        for &(from, to) in &windows {
            if ms < from {
                clock.advance(Duration::from_millis(from - ms));
                ms = from;
                while engine.turn() > 0 {}
            }
            while ms < to {
                let step = if rng.percent(90) { 1 } else { rng.range(2, 70) };
                clock.advance(Duration::from_millis(step));
                ms += step;
                while engine.turn() > 0 {}
            }
        }
        stop.store(true, Ordering::SeqCst);
        for r in racers {
            r.join().unwrap();
        }
        // Everything reset later than the drive can still be pending: finish it.
        clock.advance(Duration::from_millis(300_000));
        for _ in 0..10 {
            while engine.turn() > 0 {}
            clock.advance(Duration::from_millis(1));
        }
        let mut fired = 0_u64;
        let mut cancels = 0_u64;
        for i in 0..n {
            let count = fired_count[i].load(Ordering::SeqCst);
            let was_cancelled = cancelled[i].load(Ordering::SeqCst);
            assert!(count <= 1, "timer {i} fired {count} times");
            assert!(
                count == 1 || was_cancelled,
                "timer {i} neither fired nor was cancelled (deadline {} ms)",
                floor_ms[i].load(Ordering::SeqCst)
            );
            assert!(
                !(count == 1 && was_cancelled),
                "timer {i} fired after a winning cancel"
            );
            if count == 1 {
                let at = fired_at[i].load(Ordering::SeqCst);
                let floor = floor_ms[i].load(Ordering::SeqCst);
                assert!(
                    at >= floor,
                    "timer {i} fired early: at {at} ms, deadline {floor} ms"
                );
                fired += 1;
            } else {
                cancels += 1;
            }
        }
        let stats = engine.stats();
        assert_eq!(stats.total.fired, fired, "stats.fired");
        assert_eq!(stats.total.cancelled, cancels, "stats.cancelled");
        assert_eq!(stats.total.scheduled, n as u64, "stats.scheduled");
        assert_eq!(stats.total.pending, 0, "stats.pending");
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0, "nodes after shutdown");
    });
}

// Why: `claim_due` takes up to 64 timers off the wheel before claiming any; those pushed
// back (reset later) or mid-reset are filed again. A large jump makes many finest slots
// due at once (the interleaved walk), with half the timers pushed back a few ticks into
// the same jump and some pushed beyond it: each fires once, at or after its deadline.
#[test]
fn engine_interleaved_claim_with_pushed_back_timers_fires_each_once() {
    support::within(Duration::from_secs(60), "interleaved claim", || {
        let (engine, clock) = support::manual(1);
        let start = clock.now();
        let n = 6000_usize;
        let log: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
        let mut rng = Rng(0x1F7E);
        let mut deadlines = vec![0_u64; n];
        let mut handles = Vec::new();
        for (i, deadline) in deadlines.iter_mut().enumerate() {
            let ms = 10 + rng.below(60);
            *deadline = ms;
            let log = Arc::clone(&log);
            let c = clock.clone();
            handles.push(
                engine
                    .schedule_at(start + Duration::from_millis(ms), move || {
                        let now = (c.now() - start).as_millis() as u64;
                        log.lock().unwrap().push((i, now));
                    })
                    .unwrap(),
            );
        }
        engine.turn();
        for (i, deadline) in deadlines.iter_mut().enumerate() {
            if i % 2 == 0 {
                let ms = *deadline + 1 + rng.below(if i % 4 == 0 { 10 } else { 200 });
                assert!(engine.reset_at(handles[i], start + Duration::from_millis(ms)));
                *deadline = ms;
            }
        }
        // One jump over every original deadline, turned until quiet, then the rest.
        clock.advance(Duration::from_millis(75));
        while engine.turn() > 0 {}
        let by_75 = log.lock().unwrap().len();
        let expected_by_75 = deadlines.iter().filter(|&&d| d <= 75).count();
        assert_eq!(by_75, expected_by_75, "what was due at 75 ms");
        clock.advance(Duration::from_millis(300));
        while engine.turn() > 0 {}
        let log = log.lock().unwrap();
        let mut seen = vec![0_u32; n];
        for &(i, at) in log.iter() {
            seen[i] += 1;
            assert!(
                at >= deadlines[i],
                "timer {i} at {at} ms, deadline {}",
                deadlines[i]
            );
        }
        assert!(seen.iter().all(|&c| c == 1), "each timer exactly once");
        drop(log);
        assert_eq!(engine.stats().total.fired, n as u64);
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Drives `h` by `next_deadline` up to `until`, one `poll_expired` call at a time, and
/// returns the most list operations any single call did, and how many drains fired nothing.
fn max_single_poll_work(h: &mut Harness, until: Instant) -> (u64, u64) {
    let mut max = 0;
    let idle0 = h.idle_polls;
    while let Some(next) = h.wheel.next_deadline() {
        if next > until {
            break;
        }
        let mut any = false;
        loop {
            let before = h.wheel.link_operations();
            let out = h.poll_once(next);
            max = max.max(h.wheel.link_operations() - before);
            if !out {
                break;
            }
            any = true;
        }
        if !any {
            h.idle_polls += 1;
        }
        h.check_next_deadline();
    }
    (max, h.idle_polls - idle0)
}

// Why: an empty wheel (every timer of a storm cancelled while pre-cascade was walking its
// level-3 slot) must not ask for wake-ups: `pre_cascade_tick` trusts
// `pre_cascaded[level].1`, a count taken at the first look that cancels do not lower, and
// `pre_cascade` never clears it once the slot is empty (`left == 0 => continue`). The
// empty wheel then wakes at every tick for the last ceil(stale / 2048) ticks before the
// boundary (25 here; up to a whole slot of the level below for bigger storms).
#[test]
fn a_cancelled_level3_storm_does_not_make_an_empty_wheel_wake_every_tick() {
    let mut h = Harness::default_geometry();
    let b3 = 262_144_u64;
    for i in 0..50_000_u64 {
        h.insert_tick(b3 + (i * 13) % 262_144);
    }
    // Into level-2 slot 63: pre-cascade of level-3 slot 1 has begun.
    let at = h.at(b3 - 4000);
    h.drain(at);
    for pick in 0..50_000 {
        h.cancel(pick);
    }
    assert!(h.wheel.is_empty());
    let mut wakes = 0;
    while let Some(next) = h.wheel.next_deadline() {
        assert_eq!(h.wheel.poll_expired(next), None);
        wakes += 1;
        assert!(wakes < 100_000);
    }
    assert!(wakes <= 2, "{wakes} wake-ups of an empty wheel");
}

// Why: `pre_cascaded` freezes the count of timers to look at on the first poll in the
// window; timers filed into the same coarse slot afterwards (a burst arriving in the
// last 64 ticks before a level-2 boundary, with deadlines in the next 4 s) are never
// moved ahead of time and `pre_cascade_tick` does not ask for polls for them: the poll at
// the boundary moves them all at once, the single big poll that pacing is there to avoid.
#[test]
fn a_storm_filed_after_pre_cascades_first_look_is_moved_in_shares() {
    let mut h = Harness::default_geometry();
    let b = 8192_u64;
    // The first poll in level-1 slot 63 of level-2 slot 1 takes the (empty) count.
    let at = h.at(b - 60);
    h.drain(at);
    let n = 100_000_u64;
    for i in 0..n {
        h.insert_tick(b + (i * 7) % 4096);
    }
    let (max, _) = {
        let until = h.at(b + 4096);
        max_single_poll_work(&mut h, until)
    };
    assert!(
        max <= n / 8,
        "one poll did {max} list operations for a {n}-timer slot"
    );
    h.finish();
}

// Why: the control for the test above: the same storm filed before the window is moved a
// share per poll, so no poll does more than a fraction of it.
#[test]
fn a_storm_filed_before_the_window_is_moved_in_shares() {
    let mut h = Harness::default_geometry();
    let b = 8192_u64;
    let at = h.at(b - 200);
    h.drain(at);
    let n = 100_000_u64;
    for i in 0..n {
        h.insert_tick(b + (i * 7) % 4096);
    }
    let (max, idle) = {
        let until = h.at(b + 4096);
        max_single_poll_work(&mut h, until)
    };
    assert!(
        max <= n / 8,
        "one poll did {max} list operations for a {n}-timer slot"
    );
    assert!(idle <= 200, "{idle} idle wake-ups");
    h.finish();
}

// Why: at a level-3 boundary, level 3's pre-cascade moves its next slot's first 4,096
// ticks into level-2 slot 0 while level 2's own pre-cascade of slot 0 is under way. The
// latter took its count at its first look (before most of the former's moves), so what
// arrived later was cascaded in one poll at the boundary (60,001 list operations). Fixed:
// level 2 walks on from where it stopped, coarser levels go first in a poll, and level 3
// is paced to finish before level 2's walk begins. A poll's work is then bounded by the
// pace (about twice 2,048 a level), not by the storm.
#[test]
fn a_level3_storm_in_its_first_level2_slot_is_moved_in_shares() {
    let mut h = Harness::default_geometry();
    let b3 = 262_144_u64;
    let n = 60_000_u64;
    for i in 0..n {
        h.insert_tick(b3 + (i * 7) % 4096);
    }
    let (max, _) = {
        let until = h.at(b3 + 4096);
        max_single_poll_work(&mut h, until)
    };
    assert!(
        max <= 10_000,
        "one poll did {max} list operations for a {n}-timer storm"
    );
    h.finish();
}

// Why: `FILL_PER_TICK`'s doc promised a slot of n timers its first move at least
// n / 2048 ticks ahead, but `pre_cascade_tick` and `pre_block_tick` cap the lead at one
// slot of the level below (64 ticks at level 2, 63 for the lookahead). The doc now says
// so; this checks the first move comes as early as the cap allows: n / 2048 ticks ahead,
// or 64, whichever is less.
#[test]
fn a_half_million_timer_slot_gets_its_first_move_as_early_as_its_level_allows() {
    let mut h = Harness::default_geometry();
    let b = 8192_u64;
    let at = h.at(b - 1000);
    h.drain(at);
    let n = 500_000_u64;
    for i in 0..n {
        h.insert_tick(b + (i * 7) % 4096);
    }
    let first = h.wheel.next_deadline().unwrap();
    let lead = b - h.floor_tick(first);
    assert!(
        lead >= (n / 2048).min(64),
        "first move only {lead} ticks ahead of the slot"
    );
}

// Why: the moves ahead of time were paced per poll, and an engine's owner polls several
// times a tick while timers are due (each look that drains them): each such poll moved its
// whole share, so a block's 64,000-timer coarse slot moved within the first dozen ticks of
// the block before, up to a millisecond of moves a tick, and the fire storm's worst
// lateness came every 64 ticks. In a tick that has handed out due timers the pace is per
// tick now: polls after the one that drained them move nothing more. In a tick with
// nothing due, polls still move a share each (a burst armed all at once is polled at every
// look while its timers arrive, and needs its slot moved early), and either way the slot
// has moved before its block begins and every timer fires.
#[test]
fn moves_ahead_of_time_are_paced_per_tick_while_timers_are_due() {
    for due_meanwhile in [true, false] {
        let mut h = Harness::default_geometry();
        // In block 1 (ticks 65..128); the next block's coarse slot gets 64,000 timers.
        let at = h.at(70);
        h.drain(at);
        let n = 64_000_u64;
        for i in 0..n {
            h.insert_tick(129 + i % 64);
        }
        if due_meanwhile {
            for t in 71..=128 {
                for _ in 0..10 {
                    h.insert_tick(t);
                }
            }
        }
        let (mut in_first_polls, mut in_later_polls) = (0, 0);
        let mut last_busy_tick = 0;
        for t in 71..=128 {
            let now = h.at(t);
            let before = h.wheel.link_operations();
            let mut handed_out = 0;
            while h.poll_once(now) {
                handed_out += 1;
            }
            in_first_polls += h.wheel.link_operations() - before;
            let before = h.wheel.link_operations();
            for _ in 0..7 {
                assert!(!h.poll_once(now));
            }
            in_later_polls += h.wheel.link_operations() - before;
            assert_eq!(handed_out, if due_meanwhile { 10 } else { 0 }, "tick {t}");
            if h.wheel.link_operations() > before {
                last_busy_tick = t;
            }
        }
        if due_meanwhile {
            assert_eq!(
                in_later_polls, 0,
                "polls after a busy tick's first moved more ({in_first_polls} in first polls)"
            );
        } else {
            assert!(
                in_later_polls > 0 && last_busy_tick < 128,
                "idle ticks' later polls moved nothing, or the move ran up to the block"
            );
        }
        let (until, before) = (h.at(192), h.fired);
        max_single_poll_work(&mut h, until);
        assert_eq!(h.fired - before, n, "every timer fired");
        h.finish();
    }
}
