//! Timers a level-2+ boundary leaves in its slot: the ones due in the slot's last block
//! (its last slot of the level below), which moves ahead of time cannot put anywhere
//! before the boundary, are moved down a share per poll after it instead of all at once
//! by the boundary's poll. These tests drive a `Wheel` by hand: the poll that crosses the
//! boundary stays small, whether the owner polls every tick or only where `next_deadline`
//! says, and leftovers that are cancelled, reset either way, joined by new timers or
//! jumped over all fire exactly once, never early, with `next_deadline` never late (the
//! harness checks those at every drain).

use crate::support::wheel_harness::Harness;

/// A level-2 boundary of the default geometry (64 slots a level): a level-2 slot spans
/// 4,096 ticks, and its last block begins 4,032 ticks after its start.
const BOUNDARY: u64 = 8192;
const LAST_BLOCK: u64 = 4032;

/// Arms `n` timers over the last block of the level-2 slot beginning at [`BOUNDARY`], with
/// the wheel drained up to 300 ticks before it (so they are filed on level 2).
fn storm_in_last_block(n: u64) -> Harness {
    let mut h = Harness::default_geometry();
    let at = h.at(BOUNDARY - 300);
    h.drain(at);
    for i in 0..n {
        h.insert_tick(BOUNDARY + LAST_BLOCK + i % 64);
    }
    h
}

#[test]
fn an_owner_polling_only_when_asked_never_moves_the_leftovers_at_once() {
    let n = 200_000;
    let mut h = storm_in_last_block(n);
    // An event loop: sleep until `next_deadline`, poll, repeat. The moves ahead of time
    // ask for the polls they need.
    h.finish();
    let (work, tick) = h.max_poll_work;
    assert!(
        work <= n / 10,
        "one poll did {work} list operations at tick {tick} for {n} timers"
    );
    assert_eq!(h.fired, n);
}

#[test]
fn busy_ticks_across_the_boundary_stay_small() {
    let n = 200_000;
    let mut h = storm_in_last_block(n);
    for t in BOUNDARY - 299..BOUNDARY + 200 {
        h.insert_tick(t + 5);
        let (work, _) = h.busy_tick(t, 3);
        assert!(work <= n / 10, "tick {t} did {work} list operations");
    }
    h.finish();
}

#[test]
fn leftovers_cancelled_reset_joined_and_jumped_over_fire_exactly_once() {
    let n = 20_000_u64;
    let mut h = storm_in_last_block(n);
    // Cross the boundary, so that the storm is left in its slot.
    h.step_ticks(400);
    let now = h.now_tick();
    assert!(now > BOUNDARY);
    for pick in 0..h.keys.len() {
        match pick % 8 {
            // Cancelled while left in the slot.
            0 | 1 => h.cancel(pick),
            // Brought forward into the current block, and to the next tick.
            2 => {
                let to = h.at(now + 1 + (pick as u64 % 60));
                h.reset(pick, to);
            }
            // Pushed later within the last block, and beyond the slot.
            3 => {
                let to = h.at(BOUNDARY + LAST_BLOCK + 63);
                h.reset(pick, to);
            }
            4 => {
                let to = h.at(BOUNDARY + 4096 + (pick as u64 % 5000));
                h.reset(pick, to);
            }
            _ => {}
        }
    }
    // New timers for the same block, filed on level 1 now.
    for i in 0..2_000 {
        h.insert_tick(BOUNDARY + LAST_BLOCK + i % 64);
    }
    h.check_next_deadline();
    h.step_ticks(100);
    // A jump past the tick by which the leftovers had to move down, and past the block
    // they are due in.
    let far = h.at(BOUNDARY + LAST_BLOCK + 70);
    h.drain(far);
    h.finish();
}

#[test]
fn a_jump_from_before_the_boundary_to_past_it_fires_everything_in_order() {
    for landing in [
        BOUNDARY,
        BOUNDARY + 1,
        BOUNDARY + 2000,
        BOUNDARY + LAST_BLOCK + 10,
    ] {
        let mut h = storm_in_last_block(5_000);
        // Walk part of the way through the moves ahead of time, then jump.
        h.step_ticks(250);
        let at = h.at(landing);
        h.drain(at);
        h.finish();
        assert_eq!(h.fired, 5_000, "landing at tick {landing}");
    }
}

/// A level-2 slot full of timers, most of a storm's, whose boundary comes while the storm
/// already fires every tick: the moves ahead of time share the ticks before the boundary
/// with the due timers, and none may take much of a tick. They used to fit in the last
/// block before the boundary alone, a share per tick of twice what was left over the ticks
/// left, which for a million timers was more than a 250 µs tick could do (the wheel fell
/// behind its pace and the boundary moved hundreds of thousands at once); they now start
/// four blocks before it, each block moving what is due before it.
#[test]
fn a_full_level_2_slot_is_moved_over_the_blocks_before_its_boundary() {
    let n = 200_000_u64;
    let mut h = Harness::default_geometry();
    let at = h.at(BOUNDARY - 600);
    h.drain(at);
    // Due over the slot's first 62 blocks, as a storm of a second at a 250 µs tick is.
    for i in 0..n {
        h.insert_tick(BOUNDARY + i % (62 * 64));
    }
    let mut worst = (0, 0);
    for t in BOUNDARY - 599..BOUNDARY + 300 {
        // The storm's own timers, due every tick across the boundary.
        for _ in 0..8 {
            h.insert_tick(t + 3);
        }
        let (work, _) = h.busy_tick(t, 1);
        worst = worst.max((work, t));
    }
    let (work, tick) = worst;
    assert!(
        work <= n / 40,
        "tick {tick} did {work} list operations for {n} timers (boundary at {BOUNDARY})"
    );
    h.finish();
    assert_eq!(h.fired, n + 899 * 8);
}
