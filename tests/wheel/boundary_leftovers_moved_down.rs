//! Timers a level-2+ boundary leaves in its slot (those due in the slot's last block, the
//! last slot of the level below), moved down a share per poll until `move_down_by`
//! (`WheelCore::leave_at_boundary`, `move_left_at_boundary`, `left_at_boundary_due`,
//! `left_at_boundary_tick`), attacked with storms, jumps, cancels and resets on many
//! geometries, in the wheel and the engine.
//!
//! Every wheel test runs through the shared harness, which checks at each drain that no
//! timer fires early, twice or after its cancel, none is left due, and `next_deadline` is
//! never later than the earliest pending deadline (rounded up to the tick); `finish` checks
//! that nothing is lost. All randomness is seeded; every instant is computed from the
//! wheel's origin, and harness tick `t` is the wheel's tick `t`.
//!
//! Three tests hold the pace promise for an owner that polls only where `next_deadline`
//! says; they pass because `pre_cascade_tick` looks past the next slot and a boundary walks
//! an unwalked slot from its head:
//! - `a_storm_armed_in_the_last_tick_before_a_boundary_is_not_moved_in_one_poll`: the
//!   boundary leaves nothing when its walk has no anchor.
//! - `level3_leftovers_moved_down_are_not_crossed_in_one_poll_by_the_level2_boundary`:
//!   level-3 leftovers, paced down into a level-2 slot two slots ahead, must not be moved
//!   at once by that slot's boundary.
//! - `a_storm_two_level2_slots_ahead_is_not_moved_in_one_poll_by_an_owner_following_next_deadline`:
//!   `pre_cascade_tick` must see past the next slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::Rng;
use crate::support::wheel_harness::Harness;
use corewheel::{Clock, ManualClock, TimerEngine, TimerHandle};

/// A level-2 boundary of the default geometry (64 slots a level, 4,096 ticks a level-2
/// slot), and where its last block begins, relative to it.
const BOUNDARY: u64 = 8192;
const LAST_BLOCK: u64 = 4032;

/// Points of interest of the level-`level` slot beginning at `b`.
struct Marks {
    /// The slot's start: the boundary.
    b: u64,
    /// Its width.
    w: u64,
    /// The width of a slot of the level below.
    finer: u64,
    /// Where its last slot of the level below begins: the leftovers are due from here.
    last: u64,
    /// `b + (slots - 2) * finer`: by when the leftovers must have moved down.
    move_down_by: u64,
}

fn marks(h: &Harness, level: u32, b: u64) -> Marks {
    let w = h.width(level);
    let finer = h.width(level - 1);
    Marks {
        b,
        w,
        finer,
        last: b + (h.slots - 1) * finer,
        move_down_by: b + h.slots.saturating_sub(2) * finer,
    }
}

/// A deadline tick to reset a leftover to, from `now` and the slot's marks: already past,
/// the next tick, inside the current block, earlier in the slot, later inside the last
/// finer slot, the next slot, far ahead, or beyond the wheel's span.
fn reset_target(h: &Harness, rng: &mut Rng, m: &Marks) -> u64 {
    let now = h.now_tick();
    let block = h.width(1);
    match rng.below(9) {
        0 => now.saturating_sub(rng.below(3)).max(1),
        1 => now + 1,
        2 => now + 1 + rng.below(block),
        3 => rng.range(now + 1, m.last.max(now + 2)),
        4 => m.last.max(now + 1) + rng.below(m.finer),
        5 => m.b + m.w + rng.below(m.w),
        6 => now + rng.below(h.width(h.levels).min(1 << 30)).max(1),
        7 => now + h.width(h.levels).min(1 << 32) + rng.below(1000),
        _ => m.move_down_by + rng.below(3),
    }
}

/// One storm round on a level-`level` boundary: timers in the boundary slot's last finer
/// slot (what the boundary leaves) and elsewhere in it, a walk into the last finer slot
/// before the boundary (for `pre_cascade` to walk and keep them), then polls across the
/// boundary to points on both sides of `move_down_by`, the last block and the next
/// boundary, with cancels (the anchor among them), resets every way and new timers between.
fn storm_round(h: &mut Harness, rng: &mut Rng, level: u32) {
    let w = h.width(level);
    let now = h.now_tick();
    let b = (now / w + 1 + rng.below(2)) * w;
    let m = marks(h, level, b);
    let n = if rng.percent(30) {
        rng.range(1100, 4000)
    } else {
        rng.range(1, 200)
    };
    let mut storm = Vec::new();
    for _ in 0..n {
        let t = match rng.below(10) {
            0 => b + rng.below(w),
            1 => m.last.saturating_sub(m.finer) + rng.below(m.finer),
            _ => m.last + rng.below(m.finer),
        };
        storm.push(h.insert_tick(t));
    }
    // Into the last finer slot before the boundary, where pre_cascade walks the slot.
    let walk_from = b.saturating_sub(m.finer).max(now + 1);
    let walk_at = rng.range(walk_from, b);
    h.advance_randomly(rng, walk_at);
    // Storm timers armed after the walk began: appended after its anchor.
    for _ in 0..rng.below(20) {
        storm.push(h.insert_tick(m.last + rng.below(m.finer)));
    }
    match rng.below(6) {
        // The anchor: the last storm timer filed into the slot.
        0 => h.cancel(*storm.last().unwrap()),
        // Every storm timer: nothing left to leave.
        1 if n < 300 => {
            for &pick in &storm {
                h.cancel(pick);
            }
        }
        _ => {}
    }
    if rng.percent(50) {
        h.advance_randomly(rng, b - 1);
    }
    let mut points = vec![
        b,
        b + 1,
        m.move_down_by.saturating_sub(1),
        m.move_down_by,
        m.move_down_by + 1,
        m.last.saturating_sub(1),
        m.last,
        m.last + 1,
        b + w - 1,
        b + w,
        b + w + 1,
        b + rng.below(w),
        b + rng.below(w),
    ];
    points.sort_unstable();
    points.dedup();
    // Cross the boundary, then visit some of the points in order.
    for &p in &points {
        if p <= h.now_tick() || rng.percent(40) {
            continue;
        }
        h.advance_randomly(rng, p);
        for _ in 0..rng.below(4) {
            let pick = storm[rng.below(storm.len() as u64) as usize];
            match rng.below(5) {
                0 => h.cancel(pick),
                1..=3 => {
                    let t = reset_target(h, rng, &m);
                    let at = h.at(t);
                    h.reset(pick, at);
                }
                _ => {
                    let t = m.last.max(h.now_tick() + 1) + rng.below(m.finer);
                    storm.push(h.insert_tick(t));
                }
            }
        }
        h.check_next_deadline();
    }
}

/// Seeds per geometry of the random storms.
const SEEDS: u64 = 60;

#[test]
fn random_storms_across_boundaries_of_small_and_deep_geometries() {
    let geometries: [(usize, usize); 9] = [
        (2, 8),
        (4, 3),
        (4, 5),
        (8, 3),
        (8, 5),
        (16, 3),
        (16, 4),
        (32, 3),
        (64, 3),
    ];
    for (g, &(slots, levels)) in geometries.iter().enumerate() {
        for seed in 0..SEEDS {
            let mut rng = Rng(0xB0DE_0000 + 977 * g as u64 + seed);
            let mut h = Harness::with_geometry(slots, levels, Duration::from_millis(1));
            // A few timers elsewhere throughout.
            for _ in 0..20 {
                let t = 1 + rng.below(h.width(levels as u32).min(1 << 20) * 2);
                h.insert_tick(t);
            }
            for _ in 0..4 {
                let level = rng.range(2, levels as u64) as u32;
                if h.width(level) > 1 << 17 {
                    continue;
                }
                storm_round(&mut h, &mut rng, level);
            }
            h.finish();
        }
    }
}

/// Arms `n` timers over the last block of the level-2 slot beginning at [`BOUNDARY`] in
/// the tick just before it, after that tick's poll, and follows `next_deadline` to the
/// end. With `one_kept`, one timer due in that block was armed a hundred ticks before, so
/// that `pre_cascade` walked and kept it (its anchor). Returns the most list operations
/// one poll did, and its tick.
fn storm_armed_in_the_last_tick(n: u64, one_kept: bool) -> (u64, u64) {
    let mut h = Harness::default_geometry();
    let at = h.at(BOUNDARY - 100);
    h.drain(at);
    if one_kept {
        h.insert_tick(BOUNDARY + LAST_BLOCK + 5);
    }
    h.step_ticks(99);
    assert_eq!(h.now_tick(), BOUNDARY - 1);
    for i in 0..n {
        h.insert_tick(BOUNDARY + LAST_BLOCK + i % 64);
    }
    h.finish();
    h.max_poll_work
}

/// Guards a fault since fixed. A storm
/// armed in the last tick before a level-2 boundary (a 4.05 s timeout armed then),
/// with an owner that polls wherever `next_deadline` says: `next_deadline` asks for no
/// poll in that tick (never before the next one), so the boundary's poll comes before
/// any walk; `leave_at_boundary` leaves nothing when the walk's anchor is `NIL` and the
/// whole storm moves in that one poll. One timer of the same block armed earlier (so that
/// the walk kept it and has an anchor) is enough for the boundary to walk the storm and
/// leave it, paced: the storm's pace hung on an unrelated timer. Mended: a boundary walks
/// an unwalked slot from its head, so it reads the storm once in that poll but moves
/// only what is due before the last block.
#[test]
fn a_storm_armed_in_the_last_tick_before_a_boundary_is_not_moved_in_one_poll() {
    let n = 100_000;
    let (with_anchor, _) = storm_armed_in_the_last_tick(n, true);
    assert!(
        with_anchor <= n / 10,
        "with an anchor: {with_anchor} list operations in a poll"
    );
    let (work, tick) = storm_armed_in_the_last_tick(n, false);
    assert!(
        work <= n / 10,
        "one poll did {work} list operations at tick {tick} for {n} timers armed in the \
         last tick before the boundary at {BOUNDARY} (walk had no anchor); with one timer \
         kept by the walk the most was {with_anchor}"
    );
}

/// A storm over the last level-2 slot of the level-3 slot beginning at `2 * w3`, armed 300
/// ticks before that level-3 boundary, with an owner that polls only where
/// `next_deadline` says. Returns the most list operations one poll did, and its tick.
fn level3_storm_followed(mut h: Harness, n: u64) -> (u64, u64) {
    let (w3, w2) = (h.width(3), h.width(2));
    let b3 = 2 * w3;
    let at = h.at(b3 - 300);
    h.drain(at);
    for i in 0..n {
        h.insert_tick(b3 + (h.slots - 1) * w2 + (i * 7) % w2);
    }
    h.finish();
    assert_eq!(h.fired, n);
    h.max_poll_work
}

/// Guards a fault since fixed. The level-3 boundary leaves the storm (due in its slot's
/// last level-2 slot) and moves it down, paced, by `move_down_by` into that level-2 slot,
/// which is then two level-2 slots ahead of `elapsed`. `pre_cascade_tick` looked only at
/// each level's next slot, so `next_deadline` asked for no poll in the block before that
/// level-2 slot, the owner slept from `move_down_by` to the slot's start, and that
/// boundary, whose walk never ran (no anchor), moved the whole storm in one poll: 30,000
/// list operations at tick 12,032 (16 x 5 wheel), 100,000 at tick 782,336 (default wheel).
/// Mended: `pre_cascade_tick` looks for the first big slot after the current one, and a
/// boundary walks an unwalked slot from its head. The 16 x 5 wheel's moves ahead of time
/// have a 16-tick window at the design pace (twice the share of what is left per tick
/// left), so one tick there moves about 2 n / 16 timers (8,000 list operations for 30,000);
/// its bound is n / 3, the default wheel's n / 10.
#[test]
fn level3_leftovers_moved_down_are_not_crossed_in_one_poll_by_the_level2_boundary() {
    let cases = [
        (
            "16x5",
            Harness::with_geometry(16, 5, Duration::from_millis(1)),
            30_000,
            3,
        ),
        ("64x6", Harness::default_geometry(), 100_000, 10),
    ];
    let results: Vec<_> = cases
        .into_iter()
        .map(|(name, h, n, part)| (name, n, part, level3_storm_followed(h, n)))
        .collect();
    for &(name, n, part, (work, tick)) in &results {
        assert!(
            work <= n / part,
            "{name}: one poll did {work} list operations at tick {tick} for {n} timers \
             left at a level-3 boundary (all cases: {results:?})"
        );
    }
}

/// Guards a fault since fixed, the root of the one above. A storm over a level-2 slot two
/// slots ahead of `elapsed` (armed 4 s before its slot's start, 8 to 12 s before it is
/// due), owner polling only at `next_deadline`: `pre_cascade_tick` considers only the next
/// level-2 slot, so nothing asks for a poll in the block before the storm's slot, and its
/// start moves all of it in one poll (100,000 list operations at tick 12,288 for 100,000
/// timers). Mended: `pre_cascade_tick` asks for polls for the first big slot after the
/// current one.
#[test]
fn a_storm_two_level2_slots_ahead_is_not_moved_in_one_poll_by_an_owner_following_next_deadline() {
    let n = 100_000;
    let mut h = Harness::default_geometry();
    let at = h.at(8100);
    h.drain(at);
    for i in 0..n {
        h.insert_tick(3 * 4096 + (i * 7) % 4096);
    }
    h.finish();
    assert_eq!(h.fired, n);
    let (work, tick) = h.max_poll_work;
    assert!(
        work <= n / 10,
        "one poll did {work} list operations at tick {tick} for {n} timers"
    );
}

/// A storm in the last block of a level-3 slot's last level-2 slot and one in the last
/// block of the level-2 slot that begins with it: two levels leave timers at the same
/// boundary, crossed by busy ticks (polled three times each) from 300 ticks before it to
/// 300 after. No tick there moves more than a fraction of either storm.
#[test]
fn level3_and_level2_leftovers_at_one_boundary_are_paced_in_busy_ticks() {
    // 16 slots a level: blocks of 16 ticks, level-2 slots of 256, level-3 of 4,096.
    let mut h = Harness::with_geometry(16, 5, Duration::from_millis(1));
    let b3 = 2 * 4096;
    let n = 20_000;
    let at = h.at(b3 - 4096 + 10);
    h.drain(at);
    for i in 0..n {
        // Level 3 leaves these: due in its last level-2 slot.
        h.insert_tick(b3 + 15 * 256 + (i * 7) % 256);
        // Level 2 leaves these: due in the last block of its first slot.
        h.insert_tick(b3 + 15 * 16 + i % 16);
    }
    for t in b3 - 300..b3 + 300 {
        h.insert_tick(t + 2);
        let (work, out) = h.busy_tick(t, 2);
        assert!(
            work <= n / 3,
            "tick {t} did {work} list operations, handing out {out}"
        );
    }
    // Then every tick up to past both storms.
    h.step_ticks(b3 + 4096 + 20 - h.now_tick());
    h.finish();
    assert_eq!(h.fired, 2 * n + 600);
}

/// Jumps from a point on one side of the boundary to points on both sides of
/// `move_down_by`, the last block and the next boundary, for several geometries and
/// levels, after polls that walked and left part of a storm; then a poll back in time.
#[test]
fn jumps_to_every_mark_of_a_leaving_slot_fire_everything_once() {
    for &(slots, levels) in &[(4_usize, 4_usize), (8, 4), (64, 3)] {
        for level in 2..levels as u32 {
            let probe = Harness::with_geometry(slots, levels, Duration::from_millis(1));
            let w = probe.width(level);
            if w > 1 << 14 {
                continue;
            }
            let m = marks(&probe, level, 2 * w);
            let targets = [
                m.b,
                m.b + 1,
                m.move_down_by - 1,
                m.move_down_by,
                m.move_down_by + 1,
                m.last - 1,
                m.last,
                m.last + m.finer - 1,
                m.b + m.w,
                m.b + m.w + 1,
            ];
            for (i, &from) in [m.b - 1, m.b, m.b + m.finer.min(3)].iter().enumerate() {
                for &to in &targets {
                    if to < from {
                        continue;
                    }
                    let mut h = Harness::with_geometry(slots, levels, Duration::from_millis(1));
                    let at = h.at(m.b - m.finer);
                    h.drain(at);
                    for k in 0..1500 {
                        h.insert_tick(m.last + k % m.finer);
                    }
                    h.insert_tick(m.b + m.w / 2);
                    h.insert_tick(to + 1);
                    // Walk (and, past the boundary, leave and move some) up to `from`.
                    let steps = from - h.now_tick();
                    h.step_ticks(steps);
                    let at = h.at(to);
                    h.drain(at);
                    let back = h.at(from);
                    h.drain(back);
                    h.finish();
                    assert_eq!(
                        h.fired, 1502,
                        "{slots}x{levels} level {level}: from {i} to {to}"
                    );
                }
            }
        }
    }
}

/// Leftovers of the top level of a 4-slot, 3-level wheel (a span of 64 ticks), past which
/// every epoch comes from the overflow list; resets of leftovers beyond the span.
#[test]
fn top_level_leftovers_and_overflow_epochs() {
    for seed in 0..40_u64 {
        let mut rng = Rng(0x70_9000 + seed);
        let mut h = Harness::with_geometry(4, 3, Duration::from_millis(1));
        // Top-level slots of 16 ticks; slot 1 of epoch e begins at 64 e + 16.
        let epoch = 64 * rng.range(0, 3);
        let b = epoch + 16 * rng.range(1, 4);
        let m = marks(&h, 2, b);
        let at = h.at(b - 4);
        h.drain(at);
        let mut picks = Vec::new();
        for _ in 0..rng.range(1, 40) {
            picks.push(h.insert_tick(m.last + rng.below(4)));
        }
        // Poll in the last block before the boundary so the walk keeps them.
        let at = h.at(b - 1 - rng.below(3));
        h.drain(at);
        for t in b..b + 20 {
            if rng.percent(50) {
                let at = h.at(t);
                h.drain(at);
            }
            if rng.percent(30) {
                let pick = picks[rng.below(picks.len() as u64) as usize];
                let to = match rng.below(4) {
                    0 => h.now_tick() + 64 * rng.range(1, 5) + rng.below(64),
                    1 => h.now_tick() + 1,
                    2 => m.last + 3,
                    _ => 1,
                };
                let at = h.at(to);
                h.reset(pick, at);
            }
        }
        h.finish();
    }
}

/// The engine's shards use the same core: a storm due in the last block of the level-2
/// slot after a boundary, crossed a tick at a time by turns, while other threads cancel a
/// third of it; the owner resets some leftovers between turns. Every timer runs once or is
/// cancelled (never both), and never before its deadline.
#[test]
fn engine_storm_left_at_a_boundary_with_racing_cancels_runs_once_never_early() {
    let clock = ManualClock::new();
    let engine = Arc::new(
        TimerEngine::builder()
            .workers(2)
            .manual_clock(clock.clone())
            .build()
            .expect("a manual engine"),
    );
    let origin = clock.now();
    let tick = |t: u64| origin + Duration::from_millis(t - 1);
    clock.advance(Duration::from_millis(BOUNDARY - 200));
    engine.turn();
    let n = 24_000_usize;
    let fired: Arc<Vec<AtomicU8>> = Arc::new((0..n).map(|_| AtomicU8::new(0)).collect());
    let deadlines: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let early = Arc::new(AtomicUsize::new(0));
    let mut handles: Vec<TimerHandle> = Vec::with_capacity(n);
    for i in 0..n {
        let t = BOUNDARY + LAST_BLOCK + (i as u64 * 13) % 64;
        deadlines[i].store(t, Ordering::SeqCst);
        let (fired, deadlines, early, clock) = (
            Arc::clone(&fired),
            Arc::clone(&deadlines),
            Arc::clone(&early),
            clock.clone(),
        );
        let handle = engine
            .schedule_at(tick(t), move || {
                fired[i].fetch_add(1, Ordering::SeqCst);
                if clock.now()
                    < origin + Duration::from_millis(deadlines[i].load(Ordering::SeqCst) - 1)
                {
                    early.fetch_add(1, Ordering::SeqCst);
                }
            })
            .unwrap();
        handles.push(handle);
    }
    let handles = Arc::new(handles);
    let cancelled: Arc<Vec<AtomicBool>> =
        Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let cancellers: Vec<_> = (0..3_usize)
        .map(|k| {
            let (engine, handles, cancelled, stop) = (
                Arc::clone(&engine),
                Arc::clone(&handles),
                Arc::clone(&cancelled),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || {
                let mut rng = Rng(0xCA_4CE1 + k as u64);
                while !stop.load(Ordering::SeqCst) {
                    let i = rng.below(n as u64) as usize;
                    if i % 3 == 0 && engine.cancel(handles[i]) {
                        assert!(
                            !cancelled[i].swap(true, Ordering::SeqCst),
                            "timer {i} cancelled twice"
                        );
                    }
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    let mut rng = Rng(0xE6_1E5);
    for t in BOUNDARY - 199..BOUNDARY + 4096 + 40 {
        clock.advance(Duration::from_millis(1));
        engine.turn();
        if (BOUNDARY + 1..BOUNDARY + 200).contains(&t) && rng.percent(20) {
            // Resets of leftovers, from the owner's thread: later (lazily kept in place),
            // or earlier, into the current block.
            for _ in 0..20 {
                let i = rng.below(n as u64) as usize;
                if i % 3 == 0 {
                    continue;
                }
                let to = if rng.percent(50) {
                    BOUNDARY + 4096 + rng.below(30)
                } else {
                    t + 1 + rng.below(60)
                };
                let old = deadlines[i].swap(to, Ordering::SeqCst);
                if !engine.reset_at(handles[i], tick(to)) {
                    deadlines[i].store(old, Ordering::SeqCst);
                }
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    for c in cancellers {
        c.join().unwrap();
    }
    for _ in 0..50 {
        clock.advance(Duration::from_millis(1));
        engine.turn();
    }
    assert_eq!(early.load(Ordering::SeqCst), 0, "timers ran early");
    for i in 0..n {
        let runs = fired[i].load(Ordering::SeqCst);
        let was_cancelled = cancelled[i].load(Ordering::SeqCst);
        assert_eq!(
            u8::from(!was_cancelled),
            runs,
            "timer {i}: cancelled {was_cancelled}, ran {runs} times"
        );
    }
}
