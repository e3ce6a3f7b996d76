//! The per-tick pace of moves ahead of time (`WheelCore::moved_in_tick`,
//! `left_this_tick`, `handed_out_at`, `PACED_PER_TICK_UP_TO`): in a tick that has handed
//! out due timers, the lookahead's fill (level 1) and each level's pre-cascade (level 2 and
//! up) take one share a tick, however often the wheel is polled, as long as that share is
//! at most 4,096; otherwise each poll takes its share.
//!
//! Every test checks, against a model, that no timer fires early, none fires twice or
//! after a cancel, none is left a tick overdue after a drain, every timer fires in the end,
//! and `next_deadline` is never later than the earliest pending deadline (rounded up to
//! the tick). The pacing tests also count list operations per poll and per tick, to check
//! that capping a busy tick's moves never leaves a flip or a boundary with a large
//! remainder. All randomness is seeded; every instant is computed from the wheel's origin.
//!
//! - `a_big_slot_armed_on_time_is_moved_one_share_a_busy_tick`: a share over 4,096 must
//!   not be exempt from the pace when the slot is moved on time, or a busy tick polled 8
//!   times moves 7 to 8 times what one poll does. One idle poll a tick already finishes
//!   any slot before its block (each takes twice its share of what is left).
//! - `a_half_million_timers_in_a_level2_slots_last_block_are_not_cascaded_in_one_poll`:
//!   pre-cascade leaves a level-2 slot's last block to the boundary, which must leave those
//!   timers in the slot and move them down a share per poll (`WheelCore::leave_at_boundary`).

use std::time::{Duration, Instant};

use crate::support::Rng;
use crate::support::wheel_harness::Harness;

/// Where a storm of `n` timers lies around boundary tick `b` of `level`.
fn storm(h: &mut Harness, rng: &mut Rng, b: u64, level: u32, n: u64) -> Vec<usize> {
    let w = h.width(level);
    let finer = h.width(level.saturating_sub(1));
    let block = h.width(1);
    let shape = rng.below(6);
    (0..n)
        .map(|_| {
            let t = match shape {
                // Spread over the whole coarse slot.
                0 => b + rng.below(w),
                // All in its first block: the next block's slot at a boundary.
                1 => b + rng.below(block),
                // All in its last finer slot: what pre-cascade leaves behind.
                2 => b + (h.slots - 1) * finer + rng.below(finer),
                // Exactly on the boundary.
                3 => b,
                // Straddling it.
                4 => (b + rng.below(8)).saturating_sub(4).max(1),
                // Over two of its slots.
                _ => b + rng.below(w.saturating_mul(2)),
            };
            h.insert_tick(t)
        })
        .collect()
}

/// A deadline to reset a storm timer to: earlier (due now, the next tick, inside the
/// block), the same slot, later (next slot, far), or into the last finer slot.
fn reset_target(h: &Harness, rng: &mut Rng, b: u64, level: u32) -> Instant {
    let now = h.now_tick();
    let w = h.width(level);
    let t = match rng.below(8) {
        0 => now.saturating_sub(rng.below(3)).max(1),
        1 => now + 1,
        2 => now + 1 + rng.below(h.width(1)),
        3 => b + rng.below(w),
        4 => b + w + rng.below(w),
        5 => b + w - 1 - rng.below(h.width(level - 1)),
        6 => now + rng.below(h.width(h.levels.min(10)).max(2)),
        _ => b.saturating_sub(rng.below(4)).max(now + 1),
    };
    h.at(t)
}

/// Attacks the pace of a storm on a level-`level` boundary of `h`: ticks that all hand
/// out timers (a few due each tick), each polled several times at the same instant, some
/// backwards, with cancels, resets and inserts of the storm's timers between polls, and
/// now and then a jump of many ticks.
fn busy_storm_rounds(h: &mut Harness, rng: &mut Rng, level: u32, rounds: usize) {
    for _ in 0..rounds {
        let w = h.width(level);
        let now = h.now_tick();
        let b = (now / w + 1 + rng.below(2)) * w;
        let n = rng.range(1100, 12_000);
        let victims = storm(h, rng, b, level, n);
        // From inside the window the moves run in: the block before (level 1), the last
        // slot of the level below (level 2 and up), or up to twice that.
        let window = h.width((level - 1).max(1));
        let start = b.saturating_sub(window * rng.range(1, 3)).max(now + 1);
        let end = (b + w + h.width(1) + 1).min(b + 4 * h.width(1) + 1);
        // Busy ticks: a timer or more due at each, armed ahead.
        let per_tick = rng.range(1, 4);
        for t in start..end.min(start + 3000) {
            for _ in 0..per_tick {
                h.insert_tick(t);
            }
        }
        let mut t = start;
        while t < end {
            let polls = rng.range(1, 10) as usize;
            let at = h.at(t);
            for _ in 0..polls {
                match rng.below(10) {
                    0 => {
                        for _ in 0..rng.range(1, 200) {
                            let pick = victims[rng.below(victims.len() as u64) as usize];
                            h.cancel(pick);
                        }
                    }
                    1 | 2 => {
                        for _ in 0..rng.range(1, 200) {
                            let pick = victims[rng.below(victims.len() as u64) as usize];
                            let d = reset_target(h, rng, b, level);
                            h.reset(pick, d);
                        }
                    }
                    3 => {
                        // Armed already due: the ready list hands it out.
                        let d = h.at(t.saturating_sub(rng.below(3)).max(1));
                        h.insert(d);
                    }
                    4 => {
                        // An older reading.
                        let back = h.at(t.saturating_sub(rng.below(70)).max(1));
                        h.poll_once(back);
                    }
                    _ => {}
                }
                if rng.percent(50) {
                    h.drain(at);
                } else {
                    h.poll_once(at);
                }
                h.check_next_deadline();
            }
            h.drain(at);
            t += match rng.below(40) {
                0 => rng.range(2, h.width(1).saturating_mul(3).max(3)),
                1 => rng.range(2, w.max(3)),
                _ => 1,
            };
        }
    }
    h.finish();
}

/// A model check of busy ticks, polled many times each, across storms at level-1,
/// level-2 and level-3 boundaries of the default geometry and of small ones (4 slots and
/// 2 or 3 levels, 2 slots and 5 levels, 8 x 3, 16 x 3, and one level). Must hold: never
/// early, exactly once, nothing lost, `next_deadline` never past a pending deadline.
#[test]
fn busy_ticks_polled_many_times_match_the_model_on_every_geometry() {
    let shapes: [(usize, usize); 9] = [
        (64, 6),
        (4, 2),
        (4, 3),
        (2, 5),
        (8, 3),
        (16, 3),
        (8, 2),
        (4, 1),
        (64, 1),
    ];
    for (i, &(slots, levels)) in shapes.iter().enumerate() {
        for seed in 0..24_u64 {
            let mut rng = Rng(0x9ACE_0000 + 100 * i as u64 + seed);
            let mut h = Harness::with_geometry(slots, levels, Duration::from_millis(1));
            let top = (levels as u64 - 1).clamp(1, 3);
            let level = rng.range(1, top + 1) as u32;
            busy_storm_rounds(&mut h, &mut rng, level, 2);
        }
    }
}

/// Arms `n` timers in the coarse slot of the block beginning at tick 128 (default
/// geometry) while the wheel stands at tick `first`, and a timer due at every tick from
/// then to tick 200; then polls each tick as a busy owner does (a drain and `extra` more
/// polls at the same instant). Returns, in list operations less the timers handed out,
/// the largest tick's work and its tick, and the work of tick 128, the flip.
fn busy_block(n: u64, first: u64, extra: usize) -> ((u64, u64), u64) {
    let mut h = Harness::default_geometry();
    let at = h.at(first);
    h.drain(at);
    for i in 0..n {
        h.insert_tick(128 + i % 64);
    }
    for t in first + 1..200 {
        h.insert_tick(t);
    }
    let (mut max_tick, mut flip) = ((0, 0), 0);
    for t in first + 1..200 {
        let (work, out) = h.busy_tick(t, extra);
        assert!(out >= 1, "tick {t} handed out nothing");
        if work > max_tick.0 {
            max_tick = (work, t);
        }
        if t == 128 {
            flip = work;
        }
    }
    h.finish();
    (max_tick, flip)
}

/// Attacks the flip: a next block's slot of 20,000 to 200,000 timers, paced while every
/// tick of the block before hands out a due timer and is polled 8 or 51 times, starting
/// at the block before's first tick or a third of the way through it. Capping a busy
/// tick to one share must never leave the flip (tick 128) much to move: at most one
/// `LOOKAHEAD_BUDGET`-sized remainder (1,024 moves, about as many list operations), not
/// tens of thousands; and every timer fires on time (the model checks).
#[test]
fn busy_ticks_leave_the_flip_little_to_move() {
    for &n in &[20_000_u64, 64_000, 131_072, 200_000] {
        for &first in &[64_u64, 85] {
            for &extra in &[7_usize, 50] {
                let (max_tick, flip) = busy_block(n, first, extra);
                assert!(
                    flip <= 2_100,
                    "n {n}, from tick {first}, {extra} extra polls: the flip did {flip} list \
                     operations (busiest tick {max_tick:?})"
                );
            }
        }
    }
}

/// Attacks the per-tick cap with repeated and backwards readings: a 64,000-timer next
/// block paced on time (share about 2,048), each busy tick drained, then polled 20 times
/// at the same instant and 20 times at older instants (inside the tick, and up to 70
/// ticks back, which the wheel reads as its latest), with a timer armed already due
/// between some of them (so the tick hands out again). Must hold: after the tick's first
/// idle poll, no poll of the tick moves anything more (only the ready timers are handed
/// out), and everything fires on time.
#[test]
fn repeated_and_backwards_polls_in_a_busy_tick_move_one_share() {
    let mut h = Harness::default_geometry();
    let at = h.at(64);
    h.drain(at);
    for i in 0..64_000_u64 {
        h.insert_tick(128 + i % 64);
    }
    for t in 65..128 {
        h.insert_tick(t);
    }
    let mut rng = Rng(0xBAC4_0001);
    for t in 65..128 {
        let now = h.at(t);
        h.drain(now);
        let before = h.wheel.link_operations();
        let mut handed_out = 0;
        for i in 0..40_u64 {
            if i % 7 == 3 {
                // Already due: handed out by the next poll.
                let d = h.at(t - rng.below(2));
                h.insert(d);
                handed_out += 1;
            }
            let at = if i < 20 {
                now + Duration::from_micros(rng.below(1000))
            } else {
                h.at(t.saturating_sub(rng.below(70)).max(1))
            };
            while h.poll_once(at) {}
            h.check_next_deadline();
        }
        let work = h.wheel.link_operations() - before;
        // Each already-due timer: 1 to file it on the ready list, 1 to hand it out.
        assert_eq!(
            work,
            2 * handed_out,
            "tick {t}: later polls of a busy tick moved {} more",
            work - 2 * handed_out
        );
    }
    h.finish();
}

/// Attacks the timers of slots being moved in shares while busy ticks cap the pace:
/// a 40,000-timer next block (level 1, the lookahead's fill) and a 40,000-timer level-2
/// slot (pre-cascade) on the same boundary (tick 8192), half moved, while each busy tick
/// is polled 4 times with cancels, resets earlier (due now, next tick, inside the current
/// block, into the next block), to the same deadline, and later (next block, next level-2
/// slot, far away) between the polls. Must hold: never early, exactly once, nothing lost,
/// `next_deadline` never past a pending deadline, and the boundary poll not left with
/// more than a share or two.
#[test]
fn cancels_and_resets_of_timers_being_moved_in_busy_ticks_keep_the_model() {
    let mut h = Harness::default_geometry();
    let b = 8192_u64;
    let at = h.at(b - 200);
    h.drain(at);
    let mut rng = Rng(0xCA9C_E110);
    let block: Vec<usize> = (0..40_000_u64).map(|i| h.insert_tick(b + i % 64)).collect();
    let level2: Vec<usize> = (0..40_000_u64)
        .map(|i| h.insert_tick(b + 64 + (i * 13) % 4032))
        .collect();
    for t in b - 199..b + 200 {
        h.insert_tick(t);
    }
    for t in b - 199..b + 200 {
        let now = h.at(t);
        for _ in 0..4 {
            for _ in 0..rng.range(0, 60) {
                let victims = if rng.percent(50) { &block } else { &level2 };
                let pick = victims[rng.below(victims.len() as u64) as usize];
                let target = match rng.below(9) {
                    0 => None,
                    1 => Some(t),
                    2 => Some(t + 1),
                    3 => Some(t + 1 + rng.below(64 - (t % 64).min(63))),
                    4 => Some(b + rng.below(64)),
                    5 => Some(b + 64 + rng.below(4032)),
                    6 => Some(b + 4096 + rng.below(4096)),
                    7 => Some(t + rng.below(1 << 20)),
                    _ => h.pending.get(&(h.keys[pick].1)).map(|&d| h.ceil_tick(d)),
                };
                match target {
                    None => h.cancel(pick),
                    Some(tick) => {
                        let d = h.at(tick);
                        h.reset(pick, d);
                    }
                }
            }
            h.drain(now);
        }
    }
    let (work, tick) = h.max_poll_work;
    assert!(
        work <= 20_000,
        "one poll did {work} list operations at tick {tick}"
    );
    h.finish();
}

/// Attacks state left half way by capped moves: a next block's slot and a level-2 slot
/// on the same boundary (40,000 timers each, plus 20,000 on the level-3 boundary beyond)
/// are moved part way by busy ticks polled several times, then time jumps: to the tick
/// before the boundary, onto it, into its block, past its level-2 slot, past the level-3
/// boundary, and far away; and back. Must hold: every due timer fires at the jump's drain,
/// exactly once, none early, and the rest fire later.
#[test]
fn long_gaps_from_capped_half_moves_fire_everything_due() {
    let b = 258_048_u64; // The last level-2 slot before the level-3 boundary 262,144.
    for (case, &jump) in [b - 1, b, b + 30, b + 4096 + 5, 262_144 + 70, 50_000_000]
        .iter()
        .enumerate()
    {
        for &start in &[b - 60, b - 30, b - 3] {
            let mut h = Harness::default_geometry();
            let at = h.at(b - 64 - 5);
            h.drain(at);
            for i in 0..40_000_u64 {
                h.insert_tick(b + i % 64);
                h.insert_tick(b + 64 + (i * 13) % 4032);
            }
            for i in 0..20_000_u64 {
                h.insert_tick(262_144 + (i * 29) % 262_144);
            }
            for t in b - 64 - 4..start {
                h.insert_tick(t);
                h.busy_tick(t, 5);
            }
            let at = h.at(jump);
            h.drain(at);
            let back = h.at(start);
            h.drain(back);
            assert!(h.fired > 0, "case {case}: nothing fired");
            h.finish();
        }
    }
}

/// Arms `n` timers at the ticks `deadline(i)` while the wheel stands at `first`, a timer
/// due at every tick from then until `end`, and polls each tick busy with `extra` more
/// polls. Returns the largest tick's list operations (less timers handed out) and its
/// tick.
fn busiest_tick(
    n: u64,
    first: u64,
    end: u64,
    extra: usize,
    deadline: impl Fn(u64) -> u64,
) -> (u64, u64) {
    let mut h = Harness::default_geometry();
    let at = h.at(first);
    h.drain(at);
    for i in 0..n {
        h.insert_tick(deadline(i));
    }
    for t in first + 1..end {
        h.insert_tick(t);
    }
    let mut max_tick = (0, 0);
    for t in first + 1..end {
        let (work, _) = h.busy_tick(t, extra);
        if work > max_tick.0 {
            max_tick = (work, t);
        }
    }
    h.finish();
    max_tick
}

/// Attacks `PACED_PER_TICK_UP_TO`: its doc says a share over 4,096 is "a slot behind its
/// pace, close to its block", and lets each poll of a busy tick take it. But a slot armed
/// as early as the wheel can move it is over that from its first move whenever it holds
/// more than about 129,000 timers (2 x n / 63 > 4,096): a next block of 200,000 timers
/// armed at the previous block's first tick, and a level-2 slot of 500,000 armed 300 ticks
/// before its window. Such a slot is not behind; one share a tick still moves it all before
/// the flip (the single-poll runs below, where each tick has exactly one idle poll, show
/// the same pace leaves no remainder). Must hold (the point of the per-tick pace): polling a busy
/// tick 8 times moves not much more in that tick than polling it once.
#[test]
fn a_big_slot_armed_on_time_is_moved_one_share_a_busy_tick() {
    type Case = (&'static str, u64, u64, u64, fn(u64) -> u64);
    let cases: [Case; 2] = [
        ("next block of 200,000", 200_000, 64, 200, |i| 128 + i % 64),
        (
            "level-2 slot of 500,000",
            500_000,
            8192 - 300,
            8192 + 200,
            |i| 8192 + (i * 7) % 4096,
        ),
    ];
    let mut faults = Vec::new();
    for (what, n, first, end, deadline) in cases {
        let once = busiest_tick(n, first, end, 0, deadline);
        let eight = busiest_tick(n, first, end, 7, deadline);
        if eight.0 > once.0 * 3 / 2 {
            faults.push(format!(
                "{what}: a busy tick polled 8 times did {} list operations (tick {}); \
                 polled once, the busiest tick did {} (tick {})",
                eight.0, eight.1, once.0, once.1
            ));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("; "));
}

/// Attacks a huge slot crossing a level-2 boundary where pre-cascade cannot help:
/// 500,000 timers in the last level-1 slot of the level-2 slot beginning at tick 8192
/// (ticks 12,224..12,288). Pre-cascade walks them in the window before 8192 but leaves
/// them (level 1's slot 63 is the current block's then), so the poll at 8192 cascades all
/// of them at once. Must hold (the brief): no single poll does an enormous amount of
/// work; here at most a tenth of the slot.
#[test]
fn a_half_million_timers_in_a_level2_slots_last_block_are_not_cascaded_in_one_poll() {
    let mut h = Harness::default_geometry();
    let b = 8192_u64;
    let at = h.at(b - 300);
    h.drain(at);
    let n = 500_000_u64;
    for i in 0..n {
        h.insert_tick(b + 4032 + i % 64);
    }
    for t in b - 299..b + 100 {
        h.insert_tick(t);
        h.busy_tick(t, 3);
    }
    let (work, tick) = h.max_poll_work;
    assert!(
        work <= n / 10,
        "one poll did {work} list operations at tick {tick} for a {n}-timer slot"
    );
    h.finish();
}
