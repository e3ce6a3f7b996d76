//! The single-threaded hierarchical timing wheel.

use std::fmt;
use std::mem::size_of;
use std::time::{Duration, Instant};

use crate::error::CapacityError;
use crate::geometry::Geometry;
use crate::list::List;
use crate::node::{Filed, Location, NIL, Node};
use crate::slab::{Slab, SlabKey};
use crate::ticks::{NEVER, Ticks};
use crate::timer_key::TimerKey;
use crate::wheel_builder::WheelBuilder;

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
    ticks: Ticks,
    geometry: Geometry,
    /// Every tick up to and including this one has been processed.
    elapsed: u64,
    /// The latest instant passed to `poll_expired`: an earlier one is treated as this, and a
    /// deadline at or before it is due at once.
    last_poll: Option<Instant>,
    lists: Lists,
    slab: Slab<Node<T>>,
}

/// Every list a timer can be filed on. Kept apart from the slab so that both can be
/// borrowed at once: the lists hold heads and tails, the slab the links between.
struct Lists {
    /// The levels, finest first, plus (with two levels or more) a second finest level: the
    /// lookahead, into which the next block's coarse slot is moved a little at a time while
    /// the current block runs, so that no single poll has to move it all at once.
    levels: Box<[Level]>,
    /// Which of the two finest arrays is the finest level now; locations name arrays, so
    /// swapping roles is O(1) and moves no timer.
    current0: usize,
    /// The other one, the lookahead; `None` for a one-level wheel.
    spare0: Option<usize>,
    /// Timers already due: filed with a deadline at or before `elapsed`, or cascaded onto it.
    ready: List,
    /// Timers beyond the levels' span.
    overflow: List,
    /// No overflow timer is due before this tick (a lower bound: cancels do not raise it).
    overflow_earliest: u64,
    link_operations: u64,
}

struct Level {
    /// Bit `s` is set when slot `s` holds a timer.
    occupied: u64,
    slots: Box<[Slot]>,
}

#[derive(Clone, Copy)]
struct Slot {
    timers: List,
    /// No timer in this slot is due before this tick (a lower bound: cancels do not raise
    /// it). Lets `next_deadline` report the real deadline rather than the slot's start.
    earliest: u64,
}

impl Slot {
    const EMPTY: Self = Self {
        timers: List::EMPTY,
        earliest: u64::MAX,
    };
}

/// The next thing that needs processing, and the tick it begins at.
#[derive(Debug, Clone, Copy)]
struct Expiration {
    kind: Due,
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
enum Due {
    /// A slot of the finest level: its timers are due at its tick.
    Finest { slot: usize },
    /// A slot of a coarser level, whose timers move to finer levels at its start.
    Coarse { level: usize, slot: usize },
    /// The next block begins: the lookahead becomes the finest level.
    Flip,
    /// The overflow list's next epoch begins.
    Overflow,
}

/// Timers moved from the next block's coarse slot into the lookahead per idle poll: a few
/// hundred microseconds of cache misses at most, so a poll that finds nothing due is never
/// delayed by as much as a millisecond tick.
const LOOKAHEAD_BUDGET: usize = 1024;

impl Lists {
    #[inline]
    fn list(&self, location: Location) -> &List {
        match location.decode() {
            Filed::Ready => &self.ready,
            Filed::Overflow => &self.overflow,
            Filed::Slot { level, slot } => &self.levels[level].slots[slot].timers,
        }
    }

    /// Appends a node whose links were set from `self.list(location).tail()`.
    // Forced: LLVM leaves these out of line on size, and the call is a tenth of an insert.
    #[inline(always)]
    fn link_back<T>(
        &mut self,
        slab: &mut Slab<Node<T>>,
        location: Location,
        index: u32,
        deadline: u64,
    ) {
        self.link_operations += 1;
        match location.decode() {
            Filed::Ready => self.ready.link_back(slab, index),
            Filed::Overflow => {
                self.overflow_earliest = self.overflow_earliest.min(deadline);
                self.overflow.link_back(slab, index);
            }
            Filed::Slot { level, slot } => {
                let level = &mut self.levels[level];
                level.occupied |= 1 << slot;
                let slot = &mut level.slots[slot];
                slot.earliest = slot.earliest.min(deadline);
                slot.timers.link_back(slab, index);
            }
        }
    }

    /// Closes the gap left by a node that was on the list at `location` with links `prev`
    /// and `next`.
    #[inline(always)]
    fn unlink_between<T>(
        &mut self,
        slab: &mut Slab<Node<T>>,
        location: Location,
        prev: u32,
        next: u32,
    ) {
        self.link_operations += 1;
        match location.decode() {
            Filed::Ready => self.ready.unlink_between(slab, prev, next),
            Filed::Overflow => {
                self.overflow.unlink_between(slab, prev, next);
                if self.overflow.is_empty() {
                    // A stale lower bound must not outlive the list: it would put the next
                    // overflow timer's epoch behind `elapsed`.
                    self.overflow_earliest = u64::MAX;
                }
            }
            Filed::Slot { level, slot } => {
                let timers = &mut self.levels[level].slots[slot].timers;
                timers.unlink_between(slab, prev, next);
                if timers.is_empty() {
                    self.mark_empty(level, slot);
                }
            }
        }
    }

    /// The array serving as logical level `level`.
    #[inline]
    fn physical(&self, level: usize) -> usize {
        if level == 0 { self.current0 } else { level }
    }

    #[inline]
    fn mark_empty(&mut self, level: usize, slot: usize) {
        let level = &mut self.levels[level];
        level.occupied &= !(1 << slot);
        level.slots[slot].earliest = u64::MAX;
    }

    /// Empties a slot of the array at physical index `level` and returns what it held.
    fn take(&mut self, level: usize, slot: usize) -> List {
        let timers = self.levels[level].slots[slot].timers.take();
        self.mark_empty(level, slot);
        timers
    }

    /// Empties the overflow list and returns what it held.
    fn take_overflow(&mut self) -> List {
        self.overflow_earliest = u64::MAX;
        self.overflow.take()
    }
}

impl Wheel<()> {
    /// A builder for a wheel with a chosen tick, geometry and capacity hint.
    ///
    /// It lives on `Wheel<()>` only so that `Wheel::builder()` needs no type annotation;
    /// [`WheelBuilder::build`] makes a wheel of any value type.
    ///
    /// ```
    /// use corewheel::Wheel;
    /// use std::time::{Duration, Instant};
    ///
    /// let wheel: Wheel<u32> = Wheel::builder()
    ///     .tick(Duration::from_micros(100))
    ///     .slots_per_level(32)
    ///     .levels(8)
    ///     .capacity(10_000)
    ///     .build(Instant::now())
    ///     .expect("a valid geometry");
    /// assert!(wheel.is_empty());
    /// ```
    pub fn builder() -> WheelBuilder {
        WheelBuilder::default()
    }
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
        let level = || Level {
            occupied: 0,
            slots: vec![Slot::EMPTY; geometry.slots()].into_boxed_slice(),
        };
        Self {
            ticks,
            geometry,
            elapsed: 0,
            last_poll: None,
            lists: Lists {
                levels: (0..geometry.levels() + usize::from(geometry.levels() >= 2))
                    .map(|_| level())
                    .collect(),
                current0: 0,
                spare0: (geometry.levels() >= 2).then_some(geometry.levels()),
                ready: List::EMPTY,
                overflow: List::EMPTY,
                overflow_earliest: u64::MAX,
                link_operations: 0,
            },
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
        let due_now = self.is_past(deadline);
        self.insert_filed(self.ticks.ceil(deadline), due_now, value)
    }

    /// Arms a timer due at tick `deadline` (already rounded). For the engine's workers,
    /// which keep deadlines as ticks.
    #[inline]
    pub(crate) fn try_insert_tick(
        &mut self,
        deadline: u64,
        value: T,
    ) -> Result<TimerKey, CapacityError<T>> {
        self.insert_filed(deadline, false, value)
    }

    #[inline(always)]
    fn insert_filed(
        &mut self,
        deadline: u64,
        due_now: bool,
        value: T,
    ) -> Result<TimerKey, CapacityError<T>> {
        let location = self.location_for(deadline, due_now);
        let node = Node {
            deadline,
            prev: self.lists.list(location).tail(),
            next: NIL,
            location,
            value,
        };
        let key = self
            .slab
            .insert(node)
            .map_err(|node| CapacityError(node.value))?;
        self.lists
            .link_back(&mut self.slab, location, key.index, deadline);
        Ok(TimerKey::new(key.index, key.generation))
    }

    /// The tick at which [`poll_expired`](Wheel::poll_expired) will next hand out a timer,
    /// with the guarantees of [`next_deadline`](Wheel::next_deadline).
    pub(crate) fn next_tick(&self) -> Option<u64> {
        if !self.lists.ready.is_empty() {
            return Some(self.elapsed);
        }
        let due = self.next_expiration()?;
        let earliest = match due.kind {
            Due::Finest { .. } => due.tick,
            Due::Coarse { level, slot } => {
                due.tick.max(self.lists.levels[level].slots[slot].earliest)
            }
            Due::Flip => due.tick.max(self.lookahead_earliest()),
            Due::Overflow => due.tick.max(self.lists.overflow_earliest),
        };
        (earliest < NEVER).then_some(earliest)
    }

    /// Removes every timer, due or not, and returns their values in no particular order.
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        let nodes = self.slab.take_all();
        let fresh = Self::with_parts(self.ticks, self.geometry, 0);
        self.lists = fresh.lists;
        nodes.into_iter().map(|node| node.value).collect()
    }

    /// Stops the timer and returns its value, or `None` if the key is stale: the timer
    /// already fired or was cancelled.
    #[inline]
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        let node = self.slab.remove(slab_key(key))?;
        self.lists
            .unlink_between(&mut self.slab, node.location, node.prev, node.next);
        Some(node.value)
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
        let due_now = self.is_past(deadline);
        let deadline = self.ticks.ceil(deadline);
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
        let (location, prev, next) = (node.location, node.prev, node.next);
        self.lists
            .unlink_between(&mut self.slab, location, prev, next);
        self.file(key.index(), deadline, due_now);
        true
    }

    /// Returns the next timer due at `now`, or `None` once nothing is due.
    ///
    /// Call it in a loop until it returns `None`. Timers that are due together come out in
    /// no promised order (usually the order they were filed in). A `now` earlier than the
    /// latest one polled is treated as that latest one.
    #[inline]
    pub fn poll_expired(&mut self, now: Instant) -> Option<T> {
        let now = match self.last_poll {
            Some(last) if last >= now => last,
            _ => {
                self.last_poll = Some(now);
                now
            }
        };
        let now = self.ticks.floor(now).max(self.elapsed);
        loop {
            if let Some(value) = self.take_first(Location::READY) {
                return Some(value);
            }
            let due = match self.next_expiration() {
                Some(due) if due.tick <= now => due,
                _ => {
                    self.elapsed = now;
                    self.fill_lookahead(LOOKAHEAD_BUDGET);
                    return None;
                }
            };
            debug_assert!(due.tick >= self.elapsed, "time moved backwards");
            self.elapsed = due.tick;
            if let Due::Finest { slot } = due.kind {
                // A finest-level slot holds timers due at its tick, and timers whose
                // deadline was pushed back since they were filed: hand out the first kind
                // straight from the slot, one per call, and move the second on.
                let location = Location::slot(self.lists.current0, slot);
                let head = self.lists.list(location).head();
                let node = self.slab.at(head);
                let (deadline, next) = (node.deadline, node.next);
                if deadline <= due.tick {
                    if let Some(value) = self.take_first(location) {
                        return Some(value);
                    }
                } else {
                    self.lists
                        .unlink_between(&mut self.slab, location, NIL, next);
                    self.file(head, deadline, false);
                }
            } else {
                self.process(due.kind);
            }
        }
    }

    /// The instant at which [`poll_expired`](Wheel::poll_expired) will next return a timer,
    /// or `None` when no timer will ever fire by itself: the wheel is empty, or holds only
    /// timers beyond the tick range.
    ///
    /// Never later than the earliest pending deadline (rounded up to the tick). It is that
    /// deadline exactly unless the earliest timer was cancelled or pushed back since it was
    /// filed, in which case it can be earlier: a poll then returns `None`, and this moves
    /// on. When a timer is already due it returns the latest polled instant, which is not
    /// in the future.
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.lists.ready.is_empty() {
            return Some(self.last_poll.unwrap_or_else(|| self.ticks.origin()));
        }
        // Timers beyond the tick range never fire by themselves, so there is no instant to
        // wait for (and reporting the range's end would make a sleeping loop spin there).
        self.next_tick().map(|tick| self.ticks.instant_at(tick))
    }

    /// The deadline of a pending timer, rounded up to the tick, or `None` for a stale key.
    /// A timer beyond the tick range reports the end of the range, where it still does not
    /// fire.
    pub fn deadline(&self, key: TimerKey) -> Option<Instant> {
        let node = self.slab.get(slab_key(key))?;
        Some(self.ticks.instant_at(node.deadline))
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
        self.ticks.tick()
    }

    /// The instant tick 0 begins at.
    pub fn origin(&self) -> Instant {
        self.ticks.origin()
    }

    /// Frees every chunk of timer memory that holds no live timer, spares included.
    pub fn shrink_to_fit(&mut self) {
        self.slab.shrink_to_fit();
    }

    /// Bytes of heap memory the wheel holds: the timer slab and the levels' slot tables.
    /// Excludes anything `T` itself points to.
    pub fn allocated_bytes(&self) -> usize {
        self.slab.allocated_bytes()
            + self.lists.levels.len()
                * (size_of::<Level>() + self.geometry.slots() * size_of::<Slot>())
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
    /// and how much cascading a workload causes.
    pub fn link_operations(&self) -> u64 {
        self.lists.link_operations
    }

    /// Whether a deadline is at or before the latest polled instant, and so due at once:
    /// judged on the instant itself, because rounding up to the tick could put it after.
    #[inline]
    fn is_past(&self, deadline: Instant) -> bool {
        self.last_poll.is_some_and(|last| deadline <= last)
    }

    /// The list a deadline belongs on, as seen from `elapsed`.
    #[inline]
    fn location_for(&self, deadline: u64, due_now: bool) -> Location {
        if due_now || deadline <= self.elapsed {
            return Location::READY;
        }
        let level = self.geometry.level_for(self.elapsed, deadline);
        if level >= self.geometry.levels() {
            Location::OVERFLOW
        } else {
            Location::slot(
                self.lists.physical(level),
                self.geometry.slot_for(deadline, level),
            )
        }
    }

    /// Puts a node that is on no list onto the one its deadline belongs to.
    #[inline]
    fn file(&mut self, index: u32, deadline: u64, due_now: bool) {
        let location = self.location_for(deadline, due_now);
        self.link_at(index, location, deadline);
    }

    /// Appends a node that is on no list to the list at `location`.
    #[inline]
    fn link_at(&mut self, index: u32, location: Location, deadline: u64) {
        let tail = self.lists.list(location).tail();
        let node = self.slab.at_mut(index);
        node.location = location;
        node.prev = tail;
        node.next = NIL;
        self.lists
            .link_back(&mut self.slab, location, index, deadline);
    }

    /// Removes the first timer of the list at `location` and returns its value.
    #[inline]
    fn take_first(&mut self, location: Location) -> Option<T> {
        let head = self.lists.list(location).head();
        if head == NIL {
            return None;
        }
        let node = self.slab.remove_at(head)?;
        self.lists
            .unlink_between(&mut self.slab, location, NIL, node.next);
        Some(node.value)
    }

    /// Handles an expiration other than a finest slot, now that `elapsed` has reached it.
    fn process(&mut self, due: Due) {
        let mut timers = match due {
            // Every timer of a coarse slot, or of the overflow list, is re-filed: each lands
            // on a finer level, or on the ready list.
            Due::Coarse { level, slot } => self.lists.take(level, slot),
            Due::Overflow => self.lists.take_overflow(),
            Due::Flip => {
                // Finish moving the block's coarse slot, then let the lookahead take over
                // as the finest level (the current one is empty: its block is over).
                // `elapsed` is already the block's first tick.
                let start = self.elapsed;
                self.fill_lookahead_block(start, self.geometry.slot_for(start, 1), usize::MAX);
                if let Some(spare) = self.lists.spare0 {
                    self.lists.spare0 = Some(self.lists.current0);
                    self.lists.current0 = spare;
                }
                return;
            }
            Due::Finest { .. } => return,
        };
        while let Some(index) = timers.pop_front(&mut self.slab) {
            let deadline = self.slab.at(index).deadline;
            self.file(index, deadline, false);
        }
    }

    /// The first tick of the block after the one `elapsed` is in, and the level-1 slot that
    /// holds that block's timers, when that slot is in the current level-2 rotation (at a
    /// level-2 boundary the block's timers are still on coarser levels).
    fn next_block(&self) -> Option<(u64, usize)> {
        self.lists.spare0?;
        let shift = self.geometry.shift(1);
        let block = (self.elapsed >> shift).checked_add(1)?;
        let start = block.checked_mul(1 << shift)?;
        let slot = self.geometry.slot_for(start, 1);
        (slot != 0).then_some((start, slot))
    }

    /// Moves up to `budget` timers from the next block's level-1 slot into the lookahead,
    /// each into the finest slot of its own tick. Timers pushed back out of the block by a
    /// lazy reset are re-filed where they now belong.
    fn fill_lookahead(&mut self, budget: usize) {
        if let Some((start, slot)) = self.next_block() {
            self.fill_lookahead_block(start, slot, budget);
        }
    }

    /// Moves up to `budget` timers of the block beginning at `start`, from level-1 slot
    /// `slot` into the lookahead.
    fn fill_lookahead_block(&mut self, start: u64, slot: usize, budget: usize) {
        let Some(spare) = self.lists.spare0 else {
            return;
        };
        let shift = self.geometry.shift(1);
        for _ in 0..budget {
            let Some(index) = self.lists.levels[1].slots[slot]
                .timers
                .pop_front(&mut self.slab)
            else {
                break;
            };
            let deadline = self.slab.at(index).deadline;
            if deadline >> shift == start >> shift {
                let location = Location::slot(spare, self.geometry.slot_for(deadline, 0));
                self.link_at(index, location, deadline);
            } else {
                self.file(index, deadline, false);
            }
        }
        if self.lists.levels[1].slots[slot].timers.is_empty() {
            self.lists.mark_empty(1, slot);
        }
    }

    /// No lookahead timer is due before this tick.
    fn lookahead_earliest(&self) -> u64 {
        let (Some((start, slot)), Some(spare)) = (self.next_block(), self.lists.spare0) else {
            return u64::MAX;
        };
        let lookahead = &self.lists.levels[spare];
        let first = if lookahead.occupied == 0 {
            u64::MAX
        } else {
            start + u64::from(lookahead.occupied.trailing_zeros())
        };
        let source = &self.lists.levels[1].slots[slot];
        let not_moved = if source.timers.is_empty() {
            u64::MAX
        } else {
            source.earliest
        };
        first.min(not_moved)
    }

    /// The first slot at or after `elapsed` that holds timers, finest level first: every
    /// timer on a finer level is due before the next slot of any coarser level begins, so
    /// the first hit is the earliest. The overflow list comes after every level.
    #[inline]
    fn next_expiration(&self) -> Option<Expiration> {
        for level in 0..self.geometry.levels() {
            let state = &self.lists.levels[self.lists.physical(level)];
            if state.occupied == 0 {
                if level == 0 {
                    // The lookahead's timers belong to the next block, after every finest
                    // slot and before any coarse slot that begins later.
                    let lookahead = self.lists.spare0.map(|spare| &self.lists.levels[spare]);
                    if lookahead.is_some_and(|state| state.occupied != 0) {
                        // Only ever filled for a next block that exists.
                        if let Some((start, _)) = self.next_block() {
                            return Some(Expiration {
                                kind: Due::Flip,
                                tick: start,
                            });
                        }
                        debug_assert!(false, "a lookahead without a next block");
                    }
                }
                continue;
            }
            let slot = self
                .geometry
                .next_occupied(self.elapsed, level, state.occupied);
            let tick = self.geometry.slot_start(self.elapsed, level, slot);
            debug_assert!(tick >= self.elapsed, "a slot behind elapsed was skipped");
            let kind = if level == 0 {
                Due::Finest { slot }
            } else {
                Due::Coarse { level, slot }
            };
            return Some(Expiration { kind, tick });
        }
        if self.lists.overflow.is_empty() {
            return None;
        }
        // Overflow timers are filed into the levels at the start of their epoch, the first
        // tick whose digits above the levels' span match theirs.
        let span = self.geometry.span_bits();
        Some(Expiration {
            kind: Due::Overflow,
            tick: (self.lists.overflow_earliest >> span) << span,
        })
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
            .field("tick", &self.ticks.tick())
            .field("slots_per_level", &self.geometry.slots())
            .field("levels", &self.geometry.levels())
            .field("elapsed_ticks", &self.elapsed)
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
