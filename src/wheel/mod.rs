//! The hierarchical timing wheel, owned by one thread.
//!
//! [`Wheel<T>`] is the public single-owner wheel; [`core::WheelCore`] is the level, slot and
//! bitmap machinery under it, written against the [`list::Links`] trait so that the
//! engine's shards run the same code over their pooled nodes. The rest is what only a
//! wheel needs: its geometry, the slab its timers live in, the keys that name them, and
//! its builder.
//!
//! This layer uses [`time`](crate::time) for tick arithmetic and nothing of the engine: it
//! has no atomics and no threads.

pub(crate) mod builder;
pub(crate) mod core;
pub(crate) mod geometry;
pub(crate) mod key;
pub(crate) mod list;
pub(crate) mod location;
mod slab;
mod slab_node;

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::CapacityError;
use crate::time::ticks::Ticks;
use crate::wheel::core::WheelCore;
use crate::wheel::geometry::Geometry;
use crate::wheel::key::TimerKey;
use crate::wheel::location::{Location, NIL};
use crate::wheel::slab::{Slab, SlabKey};
use crate::wheel::slab_node::Node;

/// A hierarchical timing wheel owned by one thread.
///
/// Timers carry a value of type `T` and a deadline. The wheel hands each value back from
/// [`poll_expired`](Wheel::poll_expired) once the clock passed to it has reached the deadline,
/// or from [`cancel`](Wheel::cancel) if the caller stops the timer first.
///
/// # Guarantees
/// - **Never early.** Deadlines are rounded *up* to the tick, so a value is returned only
///   when `now >= deadline`. It is returned by the first poll with `now >= deadline + tick`
///   at the latest.
/// - **O(1)** insert, cancel and reset, whatever the number of live timers. Finding the next
///   due slot is a bitmap rotate and trailing-zero count per level, so empty slots are never
///   walked. Timers on coarse levels cascade to finer ones as their time approaches, so
///   every timer fires exactly, never with the up-to-12.5% slack of the Linux kernel's
///   wheel. The next block's timers (the next 64 ticks by default) are moved down ahead of
///   time, 1024 per poll that finds nothing due, so a storm of timers due together does
///   not stall the poll at the block's first tick.
/// - **Any range.** The levels cover one epoch of 2^36 ticks with the default geometry
///   (about 2.2 years at 1 ms); a deadline in a later epoch waits on an overflow list, which
///   is scanned once at the start of each epoch that holds one of its timers, and fires
///   exactly. Time itself may run for 2^64 - 1 ticks (584 million years at 1 ms).
///   A deadline beyond that, such as the latest `Instant` a platform can represent, is
///   clamped to tick 2^64 - 1, which time never reaches: that timer never fires by itself
///   (firing it at the clamp would be early), and can still be cancelled or reset. Only a
///   wheel already polled past such a deadline when the timer is armed fires it, as due.
/// - **Safe keys.** A [`TimerKey`] whose timer has fired or been cancelled is refused, even
///   after its slot holds another timer.
/// - **Memory.** Timers live in a slab of 1024-node chunks, at 32 bytes of overhead beyond
///   `T` on 64-bit targets for a `T` aligned to 8 bytes or less (`T = u64` costs 40 bytes a
///   timer; a 16-byte-aligned `T` costs 48 beyond itself). A chunk is freed the moment its
///   last timer fires or is cancelled, except for spares: the wheel keeps as many empty
///   chunks as its capacity hint needs, and at least one, so that a count oscillating
///   around a chunk boundary does not allocate. [`shrink_to_fit`](Wheel::shrink_to_fit)
///   frees the spares too.
///
/// # Bad input
/// A deadline at or before the latest polled instant fires on the next poll. The wheel's
/// time begins at its origin: a deadline before the origin is due at the origin, and a poll
/// before the origin fires nothing. A `now` earlier than the latest one polled is treated as
/// that latest one. Stale keys and double cancels return `None` or `false`. A bad geometry
/// is a [`GeometryError`](crate::GeometryError). Nothing here panics on input.
///
/// # Example
/// ```
/// use corewheel::Wheel;
/// use std::time::{Duration, Instant};
///
/// let t0 = Instant::now();
/// let mut wheel = Wheel::new(Duration::from_millis(1), t0);
/// let idle = wheel.insert(t0 + Duration::from_millis(30), "idle timeout");
/// wheel.insert(t0 + Duration::from_millis(10), "request timeout");
///
/// assert_eq!(wheel.poll_expired(t0 + Duration::from_millis(9)), None);
/// assert_eq!(wheel.poll_expired(t0 + Duration::from_millis(10)), Some("request timeout"));
///
/// // Traffic on the connection pushes its idle timeout back.
/// assert!(wheel.reset(idle, t0 + Duration::from_millis(50)));
/// assert_eq!(wheel.poll_expired(t0 + Duration::from_millis(40)), None);
/// assert_eq!(wheel.next_deadline(), Some(t0 + Duration::from_millis(50)));
/// assert_eq!(wheel.cancel(idle), Some("idle timeout"));
/// assert!(wheel.is_empty());
/// ```
pub struct Wheel<T> {
    core: WheelCore,
    slab: Slab<Node<T>>,
}

impl<T> Wheel<T> {
    /// A wheel with the default geometry (6 levels of 64 slots) whose time starts at
    /// `origin` and moves in steps of `tick`.
    ///
    /// A zero tick is clamped to 1 ns, and one longer than `u64::MAX` nanoseconds to that.
    /// Use [`Wheel::builder`] to choose the geometry and a capacity hint.
    pub fn new(tick: Duration, origin: Instant) -> Self {
        Self::with_parts(Ticks::new(tick, origin), Geometry::DEFAULT, 0)
    }

    pub(crate) fn with_parts(ticks: Ticks, geometry: Geometry, capacity: usize) -> Self {
        Self {
            core: WheelCore::new(ticks, geometry, false),
            slab: Slab::with_capacity(capacity),
        }
    }

    /// Arms a timer that carries `value` and is due at `deadline`.
    ///
    /// A deadline at or before the latest polled instant fires on the next poll.
    ///
    /// # Panics
    /// Only if about four billion timers are already live, the most a 32-bit key can name;
    /// [`try_insert`](Wheel::try_insert) returns an error instead.
    #[inline]
    pub fn insert(&mut self, deadline: Instant, value: T) -> TimerKey {
        match self.try_insert(deadline, value) {
            Ok(key) => key,
            Err(_) => panic!("corewheel: more than 4 billion live timers in one wheel"),
        }
    }

    /// Arms a timer like [`insert`](Wheel::insert), or hands `value` back when the wheel
    /// cannot name another timer.
    #[inline]
    pub fn try_insert(
        &mut self,
        deadline: Instant,
        value: T,
    ) -> Result<TimerKey, CapacityError<T>> {
        let due_now = self.core.is_past(deadline);
        let deadline = self.core.ticks.ceil(deadline);
        let node = Node {
            deadline,
            prev: NIL,
            next: NIL,
            location: Location::READY,
            value,
        };
        let key = self
            .slab
            .insert(node)
            .map_err(|node| CapacityError(node.value))?;
        self.core.file(&mut self.slab, key.index, deadline, due_now);
        Ok(TimerKey::new(key.index, key.generation))
    }

    /// Stops the timer and returns its value, or `None` if the key is stale: the timer
    /// already fired or was cancelled.
    #[inline]
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        self.slab.get(slab_key(key))?;
        self.core.unlink(&mut self.slab, key.index());
        self.slab.remove(slab_key(key)).map(|node| node.value)
    }

    /// Moves the timer's deadline to `deadline`, earlier or later. Returns `false`, and
    /// changes nothing, if the key is stale.
    ///
    /// Pushing a deadline back only stores it: the timer stays filed where it was, and is
    /// moved to where it now belongs when that earlier place comes due. So an idle timeout
    /// reset on every read costs one write to its node, however often it is reset. An
    /// earlier deadline is re-filed at once.
    #[inline]
    pub fn reset(&mut self, key: TimerKey, deadline: Instant) -> bool {
        let due_now = self.core.is_past(deadline);
        let deadline = self.core.ticks.ceil(deadline);
        let Some(node) = self.slab.get_mut(slab_key(key)) else {
            return false;
        };
        // The ready list is handed out without looking at deadlines, so only timers filed
        // by time may be left where they are, and only for a deadline not already past.
        if !due_now && deadline >= node.deadline && node.location != Location::READY {
            node.deadline = deadline;
            return true;
        }
        node.deadline = deadline;
        self.core.unlink(&mut self.slab, key.index());
        self.core
            .file(&mut self.slab, key.index(), deadline, due_now);
        true
    }

    /// Returns the next timer due at `now`, or `None` once nothing is due.
    ///
    /// Call it in a loop until it returns `None`. Timers that are due together come out in
    /// no promised order (usually the order they were filed in). A `now` earlier than the
    /// latest one polled is treated as that latest one.
    #[inline]
    pub fn poll_expired(&mut self, now: Instant) -> Option<T> {
        let index = self.core.poll(&mut self.slab, now)?;
        self.slab.remove_at(index).map(|node| node.value)
    }

    /// The instant at which [`poll_expired`](Wheel::poll_expired) will next return a timer,
    /// or `None` when no timer will ever fire by itself: the wheel is empty, or holds only
    /// timers beyond the tick range.
    ///
    /// Never later than the earliest pending deadline (rounded up to the tick). It is that
    /// deadline exactly unless the earliest timer was cancelled or pushed back since it was
    /// filed, or the wheel has timers to move down ahead of time, in which case it can be
    /// earlier: a poll then returns `None`, and this moves on. The second happens when a
    /// coarse slot of more than about a thousand timers comes up (a storm's block): the
    /// wheel asks for a few polls in the block before it, each of which moves part of the
    /// slot, so that no poll at a deadline has to move them all. When a timer is already
    /// due it returns the latest polled instant, which is not in the future.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.core.next_deadline()
    }

    /// The deadline of a pending timer, rounded up to the tick, or `None` for a stale key.
    /// A timer beyond the tick range reports the end of the range, where it still does not
    /// fire.
    pub fn deadline(&self, key: TimerKey) -> Option<Instant> {
        let node = self.slab.get(slab_key(key))?;
        Some(self.core.ticks.instant_at(node.deadline))
    }

    /// Whether the key names a pending timer.
    #[inline]
    pub fn contains(&self, key: TimerKey) -> bool {
        self.slab.get(slab_key(key)).is_some()
    }

    /// Pending timers.
    #[inline]
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// Whether no timer is pending.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.slab.len() == 0
    }

    /// The tick length.
    pub fn tick(&self) -> Duration {
        self.core.ticks.tick()
    }

    /// The instant tick 0 begins at.
    pub fn origin(&self) -> Instant {
        self.core.ticks.origin()
    }

    /// Frees every chunk of timer memory that holds no live timer, spares included.
    pub fn shrink_to_fit(&mut self) {
        self.slab.shrink_to_fit();
    }

    /// Bytes of heap memory the wheel holds: the timer slab and the levels' slot tables.
    /// Excludes anything `T` itself points to.
    pub fn allocated_bytes(&self) -> usize {
        self.slab.allocated_bytes() + self.core.allocated_bytes()
    }

    /// Bytes the slab spends per timer, `T` included. The overhead beyond `T` is this minus
    /// `size_of::<T>()`.
    pub const fn bytes_per_timer() -> usize {
        Slab::<Node<T>>::bytes_per_entry()
    }

    /// Single-timer list operations done so far: an insert is 1, a cancel 1, a reset that
    /// brings a deadline forward 2 (one that pushes it back 0, until its old place comes
    /// due and it is moved: 2; but 2 at once for a timer that was already due), handing out
    /// a due timer 1, and moving a timer from a coarse slot to a finer one 1.
    ///
    /// A measure of the wheel's work, which shows that insert, cancel and reset are O(1)
    /// and how much cascading a workload causes. Only with the `test-util` feature.
    #[cfg(any(test, feature = "test-util"))]
    pub fn link_operations(&self) -> u64 {
        self.core.link_operations()
    }
}

#[inline]
fn slab_key(key: TimerKey) -> SlabKey {
    SlabKey {
        index: key.index(),
        generation: key.generation(),
    }
}

impl<T> fmt::Debug for Wheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("tick", &self.core.ticks.tick())
            .field("slots_per_level", &self.core.geometry.slots())
            .field("levels", &self.core.geometry.levels())
            .field("elapsed_ticks", &self.core.elapsed())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn wheel<T>() -> (Wheel<T>, Instant) {
        let t0 = Instant::now();
        (Wheel::new(ms(1), t0), t0)
    }

    fn drain<T>(wheel: &mut Wheel<T>, now: Instant) -> Vec<T> {
        std::iter::from_fn(|| wheel.poll_expired(now)).collect()
    }

    #[test]
    fn fires_at_the_deadline_and_not_before() {
        let (mut w, t0) = wheel();
        w.insert(t0 + ms(5), 'a');
        assert_eq!(w.poll_expired(t0 + ms(4)), None);
        assert_eq!(w.poll_expired(t0 + ms(5)), Some('a'));
        assert_eq!(w.poll_expired(t0 + ms(5)), None);
        assert!(w.is_empty());
    }

    #[test]
    fn cascades_from_every_level_to_the_exact_tick() {
        let (mut w, t0) = wheel();
        let delays = [
            1_u64,
            63,
            64,
            65,
            4095,
            4096,
            4097,
            262_143,
            262_145,
            1 << 24,
        ];
        for &d in &delays {
            w.insert(t0 + ms(d), d);
        }
        for &d in &delays {
            assert_eq!(w.next_deadline(), Some(t0 + ms(d)));
            assert_eq!(w.poll_expired(t0 + ms(d) - Duration::from_nanos(1)), None);
            assert_eq!(w.poll_expired(t0 + ms(d)), Some(d));
        }
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn same_tick_timers_leave_in_insertion_order() {
        let (mut w, t0) = wheel();
        for i in 0..10 {
            w.insert(t0 + ms(70), i);
        }
        assert_eq!(drain(&mut w, t0 + ms(70)), (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn cancel_and_reset_refuse_stale_keys() {
        let (mut w, t0) = wheel();
        let a = w.insert(t0 + ms(10), "a");
        assert_eq!(w.cancel(a), Some("a"));
        assert_eq!(w.cancel(a), None);
        assert!(!w.reset(a, t0 + ms(20)));
        let b = w.insert(t0 + ms(10), "b");
        assert_eq!(w.cancel(a), None, "a's stale key must not reach b");
        assert!(w.contains(b));
        assert_eq!(drain(&mut w, t0 + ms(10)), vec!["b"]);
        assert!(!w.contains(b));
    }

    #[test]
    fn reset_moves_earlier_and_later() {
        let (mut w, t0) = wheel();
        let k = w.insert(t0 + ms(1000), 1);
        assert!(w.reset(k, t0 + ms(3)));
        assert_eq!(w.deadline(k), Some(t0 + ms(3)));
        assert_eq!(w.poll_expired(t0 + ms(3)), Some(1));
        let k = w.insert(t0 + ms(5), 2);
        assert!(w.reset(k, t0 + ms(5000)));
        assert_eq!(w.poll_expired(t0 + ms(4999)), None);
        assert_eq!(w.poll_expired(t0 + ms(5000)), Some(2));
    }

    #[test]
    fn pushing_a_deadline_back_is_lazy_and_never_fires_at_the_old_one() {
        let (mut w, t0) = wheel();
        let fine = w.insert(t0 + ms(5), "fine");
        let coarse = w.insert(t0 + ms(100), "coarse");
        let before = w.link_operations();
        for step in 1..=20 {
            assert!(w.reset(fine, t0 + ms(5 + step)));
            assert!(w.reset(coarse, t0 + ms(100 + 3 * step)));
        }
        assert_eq!(
            w.link_operations(),
            before,
            "pushing back does no list work"
        );
        assert_eq!(w.deadline(fine), Some(t0 + ms(25)));
        assert_eq!(w.poll_expired(t0 + ms(24)), None);
        assert_eq!(w.poll_expired(t0 + ms(25)), Some("fine"));
        assert_eq!(w.poll_expired(t0 + ms(159)), None);
        assert_eq!(w.poll_expired(t0 + ms(160)), Some("coarse"));
    }

    #[test]
    fn the_next_blocks_timers_move_ahead_on_an_idle_poll_and_still_fire_exactly() {
        let (mut w, t0) = wheel();
        let keys: Vec<_> = (64..128).map(|i| w.insert(t0 + ms(i), i)).collect();
        let before = w.link_operations();
        assert_eq!(w.poll_expired(t0 + ms(1)), None);
        assert!(
            w.link_operations() - before >= 60,
            "an idle poll moves the next block's timers into the lookahead"
        );
        // Cancel one and push one back while they wait there.
        assert_eq!(w.cancel(keys[3]), Some(67));
        assert!(w.reset(keys[5], t0 + ms(500)));
        assert_eq!(w.next_deadline(), Some(t0 + ms(64)));
        for i in (64..128).filter(|&i| i != 67 && i != 69) {
            assert_eq!(w.poll_expired(t0 + ms(i) - Duration::from_nanos(1)), None);
            assert_eq!(w.poll_expired(t0 + ms(i)), Some(i));
        }
        assert_eq!(w.poll_expired(t0 + ms(499)), None);
        assert_eq!(w.poll_expired(t0 + ms(500)), Some(69));
        assert!(w.is_empty());
    }

    /// What driving a wheel by `next_deadline` did: for each poll, the instant and how many
    /// timers it moved between lists (its link operations less the timers it handed out).
    struct Driven {
        fired: u64,
        polls: Vec<(Instant, u64)>,
    }

    /// Arms `count` timers due at `due(i)` ticks, then drives the wheel as an event loop
    /// would (sleep until `next_deadline`, poll, drain), checking that no timer fires early.
    fn drive_by_next_deadline(count: u64, due: impl Fn(u64) -> u64) -> (Driven, Instant) {
        let (mut w, t0) = wheel();
        for i in 0..count {
            w.insert(t0 + ms(due(i)), i);
        }
        let mut driven = Driven {
            fired: 0,
            polls: Vec::new(),
        };
        let mut now = t0;
        while let Some(next) = w.next_deadline() {
            assert!(next >= now, "next_deadline went back");
            now = next;
            let before = w.link_operations();
            let mut due_here = 0;
            while let Some(i) = w.poll_expired(now) {
                assert!(t0 + ms(due(i)) <= now, "timer {i} fired early");
                due_here += 1;
            }
            driven.fired += due_here;
            driven
                .polls
                .push((now, w.link_operations() - before - due_here));
        }
        (driven, t0)
    }

    /// A storm's block: 50,000 timers due across one 64-tick block far ahead. A loop that
    /// sleeps until `next_deadline` and polls is woken in the block before, early enough
    /// for polls to move the block down a share at a time, so that no poll at or after
    /// the first deadline moves more than the flip's small remainder, and every timer
    /// still fires at its own tick, never before.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "tens of thousands of timers; the same code runs on small wheels above"
    )]
    fn a_big_block_is_moved_down_ahead_of_its_deadlines_a_share_at_a_time() {
        let count = 50_000_u64;
        let (driven, t0) = drive_by_next_deadline(count, |i| 960 + i % 64);
        assert_eq!(driven.fired, count);
        let first_due = t0 + ms(960);
        let early_wakes = driven
            .polls
            .iter()
            .filter(|(at, _)| *at < first_due)
            .count();
        let worst_due_poll = driven
            .polls
            .iter()
            .filter(|(at, _)| *at >= first_due)
            .map(|&(_, moved)| moved)
            .max()
            .unwrap_or(0);
        // Each early poll moves twice its share of what is left, so a few wakes do it,
        // not one a tick; what is left at the end (no more than the flip should move at
        // once) moves when the block begins.
        assert!(
            (2..=20).contains(&early_wakes),
            "{early_wakes} wakes ahead of the block to move it"
        );
        assert!(
            worst_due_poll <= 1024,
            "a poll at a deadline moved {worst_due_poll} timers down at once"
        );
    }

    /// A storm across a level-2 boundary (4,096 ticks): 100,000 timers due in 3,990..4,190,
    /// so most of them sit in the next level-2 slot until the boundary. The last block
    /// before it moves that slot down into level 1 a share per poll, so no poll moves more
    /// than a few thousand timers; every timer fires at its own tick, never before.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "tens of thousands of timers; the same code runs on small wheels above"
    )]
    fn a_storm_across_a_level_2_boundary_is_moved_down_ahead_a_share_at_a_time() {
        let count = 100_000_u64;
        let (driven, _) = drive_by_next_deadline(count, |i| 3_990 + (i * 7_919) % 200);
        assert_eq!(driven.fired, count);
        let worst_poll = driven
            .polls
            .iter()
            .map(|&(_, moved)| moved)
            .max()
            .unwrap_or(0);
        assert!(
            worst_poll <= 8_192,
            "a poll moved {worst_poll} timers down at once"
        );
    }

    /// The engine's split core against a model, through random inserts (near, and far
    /// enough to cascade from coarse levels), cancels, resets both ways, and claims in
    /// batches of random size as time moves on: each timer is handed out once, never
    /// before its deadline, and none is left behind once its tick has come.
    #[test]
    fn a_split_core_hands_out_what_a_model_says_under_random_operations() {
        let (mut w, t0) = wheel_split(true);
        let mut x = 0x2545_F491_4F6C_DD1D_u64;
        let mut next = move |below: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % below
        };
        let mut live: std::collections::HashMap<u64, (TimerKey, u64)> = Default::default();
        let mut now = 0_u64;
        let mut batch = [0_u32; 16];
        let steps = if cfg!(miri) { 250 } else { 40_000 };
        for id in 0..steps {
            match next(10) {
                0..=4 => {
                    let at = now + 1 + if next(8) == 0 { next(20_000) } else { next(12) };
                    live.insert(id, (w.insert(t0 + ms(at), id), at));
                }
                5 | 6 if !live.is_empty() => {
                    let pick = *live.keys().nth(next(live.len() as u64) as usize).unwrap();
                    let (key, _) = live.remove(&pick).unwrap();
                    assert_eq!(w.cancel(key), Some(pick));
                }
                7 if !live.is_empty() => {
                    let pick = *live.keys().nth(next(live.len() as u64) as usize).unwrap();
                    let at = now + 1 + next(15);
                    let entry = live.get_mut(&pick).unwrap();
                    assert!(w.reset(entry.0, t0 + ms(at)));
                    entry.1 = at;
                }
                _ => {
                    now += next(4);
                    let len = 1 + next(16) as usize;
                    take_in_batches(&mut w, t0 + ms(now), &mut batch[..len], |value| {
                        let (_, at) = live.remove(&value).expect("handed out once");
                        assert!(at <= now, "timer {value} due at {at} handed out at {now}");
                    });
                    if let Some((value, (_, at))) = live.iter().find(|(_, (_, at))| *at <= now) {
                        panic!("timer {value} due at {at} still held at {now}");
                    }
                }
            }
        }
        assert_eq!(w.len(), live.len());
    }

    /// [`wheel`], its core split as the engine's is (`split`: several lists per finest
    /// slot) or not.
    fn wheel_split(split: bool) -> (Wheel<u64>, Instant) {
        let (mut w, t0) = wheel();
        w.core = WheelCore::new(w.core.ticks, w.core.geometry, split);
        (w, t0)
    }

    /// Takes every timer due by `now` through `poll_batch` (the engine's claim) in batches
    /// of `batch.len()`, removing each and handing its value to `each`.
    fn take_in_batches(
        w: &mut Wheel<u64>,
        now: Instant,
        batch: &mut [u32],
        mut each: impl FnMut(u64),
    ) {
        loop {
            let n = w.core.poll_batch(&mut w.slab, now, batch);
            if n == 0 {
                return;
            }
            for &index in &batch[..n] {
                each(w.slab.remove_at(index).expect("a live timer").value);
            }
        }
    }

    /// `poll_batch` (the engine's claim) with many finest slots due at once: it takes from
    /// several in turn, and hands out exactly what `poll` would, once each: every timer due
    /// by `now`, none pushed back past it (those are filed again and come out later, on
    /// time).
    #[test]
    fn a_batch_over_many_due_slots_hands_out_exactly_the_due_timers_once() {
        for split in [false, true] {
            a_batch_over_many_due_slots(split);
        }
    }

    fn a_batch_over_many_due_slots(split: bool) {
        let (mut w, t0) = wheel_split(split);
        let mut keys = Vec::new();
        // Fewer under Miri, which runs each variant a hundred times slower.
        let count = if cfg!(miri) { 60 } else { 2_000_u64 };
        for i in 0..count {
            keys.push(w.insert(t0 + ms(1 + i % 30), i));
        }
        // A tenth pushed back past the batch's `now`, lazily (they stay in their slots).
        for (i, &key) in keys.iter().enumerate().filter(|(i, _)| i % 10 == 3) {
            assert!(w.reset(key, t0 + ms(35 + i as u64 % 20)));
        }
        let due_by = |i: u64, at: u64| {
            let deadline = if i % 10 == 3 { 35 + i % 20 } else { 1 + i % 30 };
            deadline <= at
        };
        let mut taken = std::collections::HashSet::new();
        let mut batch = [0_u32; 16];
        for at in [30_u64, 60] {
            take_in_batches(&mut w, t0 + ms(at), &mut batch, |value| {
                assert!(
                    due_by(value, at),
                    "timer {value} handed out before it was due"
                );
                assert!(taken.insert(value), "timer {value} handed out twice");
            });
            let expected = (0..count).filter(|&i| due_by(i, at)).count();
            assert_eq!(taken.len(), expected, "every timer due by {at} ms");
        }
        assert!(w.is_empty());
    }

    /// `poll_batch` with one finest slot due, as a burst is tick after tick: it walks the
    /// slot's list from both ends, and the timers pushed back at either end, or anywhere
    /// between, are filed again and come out at their new tick, never before; every due
    /// timer comes out once, whatever the batch size.
    #[test]
    fn a_batch_over_one_due_slot_takes_from_both_ends_and_moves_on_the_pushed_back() {
        for (batch_len, split) in [1_usize, 2, 3, 16]
            .into_iter()
            .flat_map(|n| [(n, false), (n, true)])
        {
            let (mut w, t0) = wheel_split(split);
            let count = if cfg!(miri) { 20 } else { 1_000_u64 };
            let keys: Vec<_> = (0..count).map(|i| w.insert(t0 + ms(5), i)).collect();
            // Pushed back: the first two, the last two, and every seventh between.
            let pushed = |i: u64| i < 2 || i >= count - 2 || i % 7 == 0;
            for (i, &key) in keys.iter().enumerate() {
                if pushed(i as u64) {
                    assert!(w.reset(key, t0 + ms(9)));
                }
            }
            let mut batch = vec![0_u32; batch_len];
            let mut taken = std::collections::HashSet::new();
            for at in [5_u64, 8, 9] {
                take_in_batches(&mut w, t0 + ms(at), &mut batch, |value| {
                    let due = if pushed(value) { 9 } else { 5 };
                    assert!(due <= at, "timer {value} handed out at {at} ms, due {due}");
                    assert!(taken.insert(value), "timer {value} handed out twice");
                });
                let expected = (0..count)
                    .filter(|&i| if pushed(i) { 9 <= at } else { 5 <= at })
                    .count();
                assert_eq!(taken.len(), expected, "batches of {batch_len}, at {at} ms");
            }
            assert!(w.is_empty());
        }
    }

    #[test]
    fn past_deadlines_fire_on_the_next_poll() {
        let (mut w, t0) = wheel();
        assert_eq!(w.poll_expired(t0 + ms(100)), None);
        w.insert(t0 + ms(50), "late");
        w.insert(t0, "origin");
        assert_eq!(w.next_deadline(), Some(t0 + ms(100)));
        assert_eq!(drain(&mut w, t0 + ms(100)), vec!["late", "origin"]);
    }

    #[test]
    fn backwards_clock_is_clamped() {
        let (mut w, t0) = wheel();
        w.insert(t0 + ms(20), 1);
        assert_eq!(w.poll_expired(t0 + ms(10)), None);
        assert_eq!(w.poll_expired(t0), None);
        assert_eq!(w.poll_expired(t0 + ms(20)), Some(1));
    }

    #[test]
    fn overflow_timers_fire_exactly() {
        let mut w = Wheel::builder()
            .slots_per_level(4)
            .levels(2)
            .build(Instant::now())
            .unwrap();
        let t0 = w.origin();
        // The span is 16 ticks; these wait on the overflow list and cross epochs.
        for d in [15_u64, 16, 17, 40, 1000] {
            w.insert(t0 + ms(d), d);
        }
        for d in [15_u64, 16, 17, 40, 1000] {
            assert_eq!(w.poll_expired(t0 + ms(d) - Duration::from_nanos(1)), None);
            assert_eq!(w.poll_expired(t0 + ms(d)), Some(d), "deadline {d}");
        }
    }

    #[test]
    fn link_operations_show_constant_work() {
        let (mut w, t0) = wheel();
        for i in 0..100 {
            w.insert(t0 + ms(i * 37 % 5000), i);
        }
        let before = w.link_operations();
        let k = w.insert(t0 + ms(77), 1000);
        assert_eq!(w.link_operations() - before, 1);
        assert!(w.reset(k, t0 + ms(3)));
        assert_eq!(w.link_operations() - before, 3);
        w.cancel(k);
        assert_eq!(w.link_operations() - before, 4);
    }

    #[test]
    fn dropping_a_wheel_drops_pending_values() {
        use std::rc::Rc;
        let witness = Rc::new(());
        let (mut w, t0) = wheel();
        for i in 0..50 {
            w.insert(t0 + ms(i * 100), Rc::clone(&witness));
        }
        drop(w);
        assert_eq!(Rc::strong_count(&witness), 1);
    }
}
