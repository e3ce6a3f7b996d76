//! The hierarchical timing wheel's machinery, independent of where timers are stored: the
//! levels, their occupancy bitmaps and slot lists, cascading and the lookahead. It files
//! and hands out timers by index, and reaches their deadlines and links through [`Links`],
//! so the same code serves [`Wheel`](crate::Wheel), whose timers live in a slab, and the
//! engine's shards, whose timers are pooled nodes.

use std::mem::size_of;
use std::time::Instant;

use crate::time::ticks::{NEVER, Ticks};
use crate::tuning::{FILL_PER_TICK, INTERLEAVE, LOOKAHEAD_BUDGET, PRE_CASCADE_SLOTS, SPLIT};
use crate::wheel::geometry::Geometry;
use crate::wheel::list::{Links, List};
use crate::wheel::location::{Filed, Location, NIL};

/// The wheel's state apart from its timers.
pub(crate) struct WheelCore {
    pub(crate) ticks: Ticks,
    pub(crate) geometry: Geometry,
    /// Every tick up to and including this one has been processed.
    elapsed: u64,
    /// The latest instant passed to `poll`: an earlier one is treated as this, and a
    /// deadline at or before it is due at once.
    last_poll: Option<Instant>,
    lists: Lists,
    /// Per level, where [`pre_cascade`](Self::pre_cascade) is in the coarse slot it is
    /// moving down.
    pre_cascaded: Box<[PreCascade]>,
    /// Per level (2 and up), the start of its current slot while that slot still holds
    /// timers its boundary left there, to move down a share per poll (see
    /// [`leave_at_boundary`](Self::leave_at_boundary)); `u64::MAX` otherwise.
    left_at_boundary: Box<[u64]>,
    /// Per level, the timers moved (or walked) ahead of time out of its next slot in one
    /// tick, and that tick: the lookahead's fill for level 1, pre-cascades from level 2 up.
    /// In a tick that has handed out due timers the pace is per tick, not per poll: an
    /// owner polls several times such a tick (each look that drains what is due), and
    /// when each poll moved its whole share, a block's coarse slot of 64,000 timers moved
    /// within the first dozen ticks of the block before, up to a millisecond of moves a
    /// tick: the fire storm's worst lateness came every 64 ticks, right after each flip.
    /// In a tick with nothing due each poll may move its share, as before: moving early
    /// delays nobody then, and a burst armed all at once (polled at every look while its
    /// timers arrive) needs it, or the flip before it moves the rest at once.
    moved_in_tick: Box<[(u64, u64)]>,
    /// The poll tick at which the wheel last handed out a due timer.
    handed_out_at: u64,
}

/// How far [`WheelCore::pre_cascade`] has walked one level's next slot.
#[derive(Debug, Clone, Copy)]
struct PreCascade {
    /// The slot's start: a walk of another slot starts afresh.
    start: u64,
    /// The last timer the walk left in the slot, which it goes on after; `NIL` before it
    /// has left any (everything still there is then unwalked).
    anchor: u32,
    /// Timers the walk has left in the slot.
    kept: u64,
    /// The slot of the level below that `elapsed` was in when this pass over the list
    /// began: a later one begins another pass, over what this one left.
    pass_from: usize,
    /// This pass has walked to the end of the list (timers filed there since are walked on
    /// from the anchor).
    finished: bool,
}

impl PreCascade {
    const fn starting(start: u64, pass_from: usize) -> Self {
        Self {
            start,
            anchor: NIL,
            kept: 0,
            pass_from,
            finished: false,
        }
    }
}

/// Every list a timer can be filed on. Kept apart from the nodes so that both can be
/// borrowed at once: the lists hold heads and tails, the nodes the links between.
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
    /// On a finest array of a split wheel, per slot, the lists of the timers whose index
    /// is not a multiple of [`SPLIT`]: timer `i` is on list `i % SPLIT - 1` here, the others
    /// on the slot's own. Empty on every other array.
    more: Box<[[List; SPLIT - 1]]>,
}

impl Level {
    fn new(slots: usize, split: bool) -> Self {
        Self {
            occupied: 0,
            slots: vec![Slot::EMPTY; slots].into_boxed_slice(),
            more: if split {
                vec![[List::EMPTY; SPLIT - 1]; slots].into_boxed_slice()
            } else {
                Box::default()
            },
        }
    }

    /// How many lists each slot has: [`SPLIT`] on a finest array of a split wheel, else 1.
    #[inline]
    fn lists_per_slot(&self) -> usize {
        if self.more.is_empty() { 1 } else { SPLIT }
    }

    /// Slot `slot`'s list number `sub` (below [`lists_per_slot`](Self::lists_per_slot)).
    #[inline]
    fn sub_list(&self, slot: usize, sub: usize) -> &List {
        match sub {
            0 => &self.slots[slot].timers,
            sub => &self.more[slot][sub - 1],
        }
    }

    /// [`sub_list`](Self::sub_list), to change.
    #[inline]
    fn sub_list_mut(&mut self, slot: usize, sub: usize) -> &mut List {
        match sub {
            0 => &mut self.slots[slot].timers,
            sub => &mut self.more[slot][sub - 1],
        }
    }

    /// The list of slot `slot` that timer `index` goes on.
    #[inline]
    fn list_mut(&mut self, slot: usize, index: u32) -> &mut List {
        let sub = self.sub_of(index);
        self.sub_list_mut(slot, sub)
    }

    #[inline]
    fn sub_of(&self, index: u32) -> usize {
        if self.more.is_empty() {
            0
        } else {
            index as usize % SPLIT
        }
    }

    /// Whether every list of slot `slot` is empty.
    #[inline]
    fn is_slot_empty(&self, slot: usize) -> bool {
        self.slots[slot].timers.is_empty()
            && self
                .more
                .get(slot)
                .is_none_or(|more| more.iter().all(List::is_empty))
    }
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

/// Which end of a list a walk takes from.
#[derive(Debug, Clone, Copy)]
enum End {
    Head,
    Tail,
}

/// The next thing that needs processing, and the tick it begins at.
#[derive(Debug, Clone, Copy)]
struct Expiration {
    kind: NextWork,
    tick: u64,
}

/// Finest slots due together (see [`WheelCore::due_finest_slots`]).
struct DueSlots {
    /// The first one's tick.
    tick: u64,
    slots: [usize; INTERLEAVE],
    count: usize,
}

/// What an [`Expiration`] asks of the wheel.
#[derive(Debug, Clone, Copy)]
enum NextWork {
    /// A slot of the finest level: its timers are due at its tick.
    Finest { slot: usize },
    /// A slot of a coarser level, whose timers move to finer levels at its start.
    Coarse { level: usize, slot: usize },
    /// The next block begins: the lookahead becomes the finest level.
    Flip,
    /// The overflow list's next epoch begins.
    Overflow,
}

/// How many of `left` timers a tick moves ahead of time when `ticks_left` ticks remain
/// before they must all have moved: twice its share, and never fewer than
/// [`LOOKAHEAD_BUDGET`].
fn paced_share(left: u64, ticks_left: u64) -> u64 {
    left.div_ceil(ticks_left.max(1))
        .saturating_mul(2)
        .max(LOOKAHEAD_BUDGET as u64)
}

impl Lists {
    /// The list at `location`; of a split slot, its first (see [`SPLIT`]).
    #[inline]
    fn list(&self, location: Location) -> &List {
        self.sub_list(location, 0)
    }

    /// List number `sub` at `location` (0 for the ready and overflow lists, which are
    /// never split).
    #[inline]
    fn sub_list(&self, location: Location, sub: usize) -> &List {
        match location.decode() {
            Filed::Ready => &self.ready,
            Filed::Overflow => &self.overflow,
            Filed::Slot { level, slot } => self.levels[level].sub_list(slot, sub),
        }
    }

    /// The list at `location` that timer `index` is on, or goes on.
    #[inline]
    fn list_of(&self, location: Location, index: u32) -> &List {
        match location.decode() {
            Filed::Slot { level, slot } => {
                let level = &self.levels[level];
                level.sub_list(slot, level.sub_of(index))
            }
            _ => self.list(location),
        }
    }

    /// How many lists the slot at `location` has (1 for the ready and overflow lists).
    #[inline]
    fn lists_at(&self, location: Location) -> usize {
        match location.decode() {
            Filed::Slot { level, .. } => self.levels[level].lists_per_slot(),
            _ => 1,
        }
    }

    /// Appends a node whose links were set from `self.list_of(location, index).tail()`.
    // Forced: LLVM leaves these out of line on size, and the call is a tenth of an insert.
    #[inline(always)]
    fn link_back<N: Links>(
        &mut self,
        nodes: &mut N,
        location: Location,
        index: u32,
        deadline: u64,
    ) {
        self.link_operations += 1;
        match location.decode() {
            Filed::Ready => self.ready.link_back(nodes, index),
            Filed::Overflow => {
                self.overflow_earliest = self.overflow_earliest.min(deadline);
                self.overflow.link_back(nodes, index);
            }
            Filed::Slot { level, slot } => {
                let level = &mut self.levels[level];
                level.occupied |= 1 << slot;
                let earliest = &mut level.slots[slot].earliest;
                *earliest = (*earliest).min(deadline);
                level.list_mut(slot, index).link_back(nodes, index);
            }
        }
    }

    /// Closes the gap left by node `index`, which was on the list at `location` with
    /// links `prev` and `next`.
    #[inline(always)]
    fn unlink_between<N: Links>(
        &mut self,
        nodes: &mut N,
        location: Location,
        index: u32,
        (prev, next): (u32, u32),
    ) {
        self.link_operations += 1;
        match location.decode() {
            Filed::Ready => self.ready.unlink_between(nodes, prev, next),
            Filed::Overflow => {
                self.overflow.unlink_between(nodes, prev, next);
                if self.overflow.is_empty() {
                    // A stale lower bound must not outlive the list: it would put the next
                    // overflow timer's epoch behind `elapsed`.
                    self.overflow_earliest = u64::MAX;
                }
            }
            Filed::Slot { level, slot } => {
                let array = &mut self.levels[level];
                array
                    .list_mut(slot, index)
                    .unlink_between(nodes, prev, next);
                if array.is_slot_empty(slot) {
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
        debug_assert_eq!(
            self.levels[level].lists_per_slot(),
            1,
            "a split slot taken whole"
        );
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

impl Lists {
    /// `split`: whether the finest arrays' slots have [`SPLIT`] lists each.
    fn new(geometry: Geometry, split: bool) -> Self {
        let spare0 = (geometry.levels() >= 2).then_some(geometry.levels());
        Self {
            levels: (0..geometry.levels() + usize::from(spare0.is_some()))
                .map(|array| {
                    let finest = array == 0 || Some(array) == spare0;
                    Level::new(geometry.slots(), split && finest)
                })
                .collect(),
            current0: 0,
            spare0,
            ready: List::EMPTY,
            overflow: List::EMPTY,
            overflow_earliest: u64::MAX,
            link_operations: 0,
        }
    }
}

impl WheelCore {
    /// `split`: whether each finest slot keeps [`SPLIT`] lists, for a holder that takes
    /// due timers in batches ([`poll_batch`](Self::poll_batch)); one-at-a-time
    /// [`poll`](Self::poll) then hands a slot's timers out list by list rather than in the
    /// order they were filed.
    pub(crate) fn new(ticks: Ticks, geometry: Geometry, split: bool) -> Self {
        Self {
            ticks,
            geometry,
            elapsed: 0,
            last_poll: None,
            lists: Lists::new(geometry, split),
            pre_cascaded: vec![PreCascade::starting(u64::MAX, 0); geometry.levels()]
                .into_boxed_slice(),
            left_at_boundary: vec![u64::MAX; geometry.levels()].into_boxed_slice(),
            moved_in_tick: vec![(u64::MAX, 0); geometry.levels()].into_boxed_slice(),
            handed_out_at: u64::MAX,
        }
    }

    /// Unlinks and returns the index of the next timer due at `now`, or `None` once nothing
    /// is due. See [`Wheel::poll_expired`](crate::Wheel::poll_expired).
    #[inline]
    pub(crate) fn poll<N: Links>(&mut self, nodes: &mut N, now: Instant) -> Option<u32> {
        let (_, now) = self.catch_up(now);
        loop {
            if let Some(index) = self.take_ready(nodes) {
                self.handed_out_at = now;
                return Some(index);
            }
            let due = match self.next_expiration() {
                Some(due) if due.tick <= now => due,
                _ => {
                    self.elapsed = now;
                    self.move_left_at_boundary(nodes);
                    self.pre_cascade(nodes);
                    let budget = self.fill_budget();
                    self.fill_lookahead(nodes, budget);
                    return None;
                }
            };
            debug_assert!(due.tick >= self.elapsed, "time moved backwards");
            self.elapsed = due.tick;
            if let NextWork::Finest { slot } = due.kind {
                // A finest-level slot holds timers due at its tick, and timers whose
                // deadline was pushed back since they were filed: hand out the first kind
                // straight from the slot, one per call, and move the second on.
                let location = Location::slot(self.lists.current0, slot);
                // The slot is occupied: one of its lists holds a timer.
                let sub = (0..self.lists.lists_at(location))
                    .find(|&sub| self.lists.sub_list(location, sub).head() != NIL)
                    .unwrap_or(0);
                if let Some(index) = self.take_due(nodes, (location, sub), End::Head, due.tick) {
                    self.handed_out_at = now;
                    return Some(index);
                }
            } else {
                self.process(nodes, due.kind);
            }
        }
    }

    /// Up to `out.len()` due timers into `out`, unlinked; returns how many. What as many
    /// calls to [`poll`](Self::poll) would hand out, in another order: when several finest
    /// slots are due at once (a burst its caller has fallen behind on), it takes from up to
    /// [`INTERLEAVE`] of them in turn, and from both ends of each. Walking one intrusive
    /// list is a chain of cache misses, each node's address known only once the one before
    /// it has arrived; taking from several lists, and from both ends, in turn keeps that
    /// many misses in flight.
    pub(crate) fn poll_batch<N: Links>(
        &mut self,
        nodes: &mut N,
        now: Instant,
        out: &mut [u32],
    ) -> usize {
        let mut taken = 0;
        while taken < out.len() {
            let interleaved = self.take_interleaved(nodes, now, &mut out[taken..]);
            if interleaved > 0 {
                taken += interleaved;
                continue;
            }
            match self.poll(nodes, now) {
                Some(index) => {
                    out[taken] = index;
                    taken += 1;
                }
                None => break,
            }
        }
        taken
    }

    /// When finest slots are due at `now` (and nothing comes before them): takes their
    /// due timers into `out` from each slot in turn, from both ends of its list, moving on
    /// those pushed back since they were filed; returns how many it took. 0 (for `poll` to
    /// go on) when something else comes first: the ready list, a coarse slot, the flip, or
    /// no due finest slot; also when every timer it met had been pushed back. A list
    /// walked from both ends is two chains of misses in flight rather than one: a burst is
    /// mostly one due slot at a time, as each tick comes.
    fn take_interleaved<N: Links>(
        &mut self,
        nodes: &mut N,
        now: Instant,
        out: &mut [u32],
    ) -> usize {
        let (_, now) = self.catch_up(now);
        let Some(DueSlots {
            tick,
            mut slots,
            mut count,
        }) = self.due_finest_slots(now)
        else {
            return 0;
        };
        self.elapsed = tick;
        let mut taken = 0;
        while taken < out.len() && count > 0 {
            let mut kept = 0;
            for turn in 0..count {
                let slot = slots[turn];
                if self.lists.levels[self.lists.current0].is_slot_empty(slot) {
                    continue;
                }
                slots[kept] = slot;
                kept += 1;
                let location = Location::slot(self.lists.current0, slot);
                let due_at = self.geometry.slot_start(self.elapsed, 0, slot);
                for sub in 0..self.lists.lists_at(location) {
                    for end in [End::Head, End::Tail] {
                        if taken == out.len() || self.lists.sub_list(location, sub).is_empty() {
                            break;
                        }
                        if let Some(index) = self.take_due(nodes, (location, sub), end, due_at) {
                            out[taken] = index;
                            taken += 1;
                        }
                    }
                }
            }
            count = kept;
        }
        if taken > 0 {
            self.handed_out_at = now;
        }
        taken
    }

    /// The finest slots due at `now` (the wheel's own tick), when nothing comes before
    /// them (the ready list, a coarse slot, the flip): up to [`INTERLEAVE`] of them, in
    /// order, and the first one's tick. `None` when there are none.
    fn due_finest_slots(&self, now: u64) -> Option<DueSlots> {
        if !self.lists.ready.is_empty() {
            return None;
        }
        let Some(Expiration {
            kind: NextWork::Finest { slot: first },
            tick,
        }) = self.next_expiration()
        else {
            return None;
        };
        if tick > now {
            return None;
        }
        // Every finest slot is in the current block, after `elapsed`'s: the due ones are
        // the occupied slots from the first on whose ticks have come.
        let mut slots = [0_usize; INTERLEAVE];
        let mut count = 0;
        let mut occupied = self.lists.levels[self.lists.current0].occupied >> first;
        let mut slot = first;
        while occupied != 0 && count < INTERLEAVE {
            let skip = occupied.trailing_zeros() as usize;
            slot += skip;
            if self.geometry.slot_start(self.elapsed, 0, slot) > now {
                break;
            }
            slots[count] = slot;
            count += 1;
            occupied = (occupied >> skip) >> 1;
            slot += 1;
        }
        debug_assert!(tick >= self.elapsed, "time moved backwards");
        (count > 0).then_some(DueSlots { tick, slots, count })
    }

    /// Takes whole the lists of the finest slots due at `now` (when nothing comes before
    /// them, as for [`take_interleaved`](Self::take_interleaved)), whole slots while `out`
    /// has room, into `out` as (head, tail); returns how many, 0 unless they hold
    /// `at_least` timers. The wheel holds them no more: their timers keep the links they
    /// had, for the caller to walk the lists by (both ways), and whatever of them is not
    /// due after all must be filed again. `elapsed` moves to the first slot's tick, as
    /// `take_interleaved` leaves it: the later slots taken are empty now, so a timer filed
    /// into one (once the caller is done with the lists) is found there as due.
    pub(crate) fn detach_due(
        &mut self,
        now: Instant,
        out: &mut [(u32, u32)],
        at_least: u32,
    ) -> usize {
        let (_, now) = self.catch_up(now);
        let Some(DueSlots { tick, slots, count }) = self.due_finest_slots(now) else {
            return 0;
        };
        let current = self.lists.current0;
        let per_slot = self.lists.levels[current].lists_per_slot();
        let whole = count.min(out.len() / per_slot);
        let level = &self.lists.levels[current];
        let timers: u32 = slots[..whole]
            .iter()
            .flat_map(|&slot| (0..per_slot).map(move |sub| level.sub_list(slot, sub).len()))
            .sum();
        if whole == 0 || timers < at_least {
            return 0;
        }
        self.elapsed = tick;
        let mut taken = 0;
        for &slot in &slots[..whole] {
            let level = &mut self.lists.levels[current];
            for sub in 0..per_slot {
                let list = level.sub_list_mut(slot, sub).take();
                if !list.is_empty() {
                    out[taken] = (list.head(), list.tail());
                    taken += 1;
                }
            }
            self.lists.mark_empty(current, slot);
        }
        self.handed_out_at = now;
        taken
    }

    /// The wheel's own "now" for a caller's clock reading: the latest instant any caller
    /// has passed, and its tick, never behind a tick the wheel has already processed.
    /// Several threads may take turns at one wheel with readings taken at different times
    /// (an owner and workers standing in for it); a reading older than one the wheel has
    /// seen must not make a due timer look not yet due, or the timer would be handed out
    /// and filed back as due forever. Every decision about what is due uses this.
    #[inline]
    pub(crate) fn catch_up(&mut self, now: Instant) -> (Instant, u64) {
        let now = match self.last_poll {
            Some(last) if last >= now => last,
            _ => {
                self.last_poll = Some(now);
                now
            }
        };
        (now, self.ticks.floor(now).max(self.elapsed))
    }

    /// Takes a filed timer off its list.
    #[inline]
    pub(crate) fn unlink<N: Links>(&mut self, nodes: &mut N, index: u32) {
        let (location, prev, next) = nodes.links(index);
        self.lists
            .unlink_between(nodes, location, index, (prev, next));
        // A walk ahead of time that left this timer in its slot goes on from the one
        // before it, which it walked too (or from the head).
        for walk in self.pre_cascaded.iter_mut() {
            if walk.anchor == index {
                walk.anchor = prev;
                walk.kept = walk.kept.saturating_sub(1);
            }
        }
    }

    /// Hints that the timer `index` may soon be unlinked: asks for the lines of its
    /// neighbours, which an unlink writes. Reads only the timer's own links, and a timer on
    /// no list (one arriving to be filed) names no neighbour worth asking for, or stale
    /// ones: a hint about the wrong line costs a wasted fetch, nothing else.
    #[inline]
    pub(crate) fn prefetch_neighbours<N: Links>(&self, nodes: &N, index: u32) {
        let (_, prev, next) = nodes.links(index);
        nodes.prefetch(prev);
        nodes.prefetch(next);
    }

    /// Unlinks every timer, due or not, and returns their indices.
    pub(crate) fn drain<N: Links>(&mut self, nodes: &mut N) -> Vec<u32> {
        let mut indices = Vec::new();
        let lists = &mut self.lists;
        let all = lists
            .levels
            .iter_mut()
            .flat_map(|level| {
                let own = level.slots.iter_mut().map(|slot| &mut slot.timers);
                own.chain(level.more.iter_mut().flatten())
            })
            .chain([&mut lists.ready, &mut lists.overflow]);
        for list in all {
            while let Some(index) = list.pop_front(nodes) {
                indices.push(index);
            }
        }
        let link_operations = self.lists.link_operations;
        let split = self.lists.levels[0].lists_per_slot() > 1;
        self.lists = Lists::new(self.geometry, split);
        self.lists.link_operations = link_operations;
        self.pre_cascaded.fill(PreCascade::starting(u64::MAX, 0));
        self.left_at_boundary.fill(u64::MAX);
        indices
    }

    /// The tick at which [`poll`](Self::poll) will next hand out a timer; `None` when no
    /// timer will ever fire by itself. Never later than the earliest pending deadline.
    pub(crate) fn next_tick(&self) -> Option<u64> {
        if !self.lists.ready.is_empty() {
            return Some(self.elapsed);
        }
        let due = self.next_expiration()?;
        let earliest = match due.kind {
            // The finest level's slots are all in the current block, before anything else.
            NextWork::Finest { .. } => due.tick,
            // A slot whose start has passed is handled at the next poll, before the
            // finest level's timers, which may be due before any of its own.
            NextWork::Coarse { level, slot }
                if slot == self.geometry.slot_for(self.elapsed, level) =>
            {
                due.tick
            }
            // Otherwise slots of different levels may overlap in time (a coarse slot, and
            // the next rotation of the level below, which it is being moved into ahead of
            // time), so the earliest timer is the least over all of them, each no earlier
            // than its slot's start.
            _ => self.later_work_earliest(),
        };
        // Timers beyond the tick range never fire by themselves, so there is no tick to
        // wait for (and reporting the range's end would make a sleeping loop spin there).
        (earliest < NEVER).then_some(earliest)
    }

    /// When a coarse slot with many timers comes up: the tick by which the wheel should be
    /// polled to move them down a little at a time before any of them is due (see
    /// [`FILL_PER_TICK`]) rather than all at once when the first is. The wheel is due a poll
    /// at the earlier of this and [`next_tick`](Self::next_tick).
    pub(crate) fn move_ahead_tick(&self) -> Option<u64> {
        [
            self.fill_tick(),
            self.pre_block_tick(),
            self.pre_cascade_tick(),
            self.left_at_boundary_tick(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The earlier of [`next_tick`](Self::next_tick) and
    /// [`move_ahead_tick`](Self::move_ahead_tick), as an instant; the latest polled instant
    /// when a timer is already due.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        if !self.lists.ready.is_empty() {
            return Some(self.last_poll.unwrap_or_else(|| self.ticks.origin()));
        }
        let tick = match (self.next_tick(), self.move_ahead_tick()) {
            (Some(due), Some(work)) => Some(due.min(work)),
            (due, work) => due.or(work),
        };
        tick.map(|tick| self.ticks.instant_at(tick))
    }

    pub(crate) fn elapsed(&self) -> u64 {
        self.elapsed
    }

    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn link_operations(&self) -> u64 {
        self.lists.link_operations
    }

    /// Bytes of the levels' slot tables and the per-level state of moves ahead of time.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.lists.levels.len() * (size_of::<Level>() + self.geometry.slots() * size_of::<Slot>())
            + self
                .lists
                .levels
                .iter()
                .map(|level| size_of_val(&*level.more))
                .sum::<usize>()
            + size_of_val(&*self.pre_cascaded)
            + size_of_val(&*self.left_at_boundary)
            + size_of_val(&*self.moved_in_tick)
    }

    /// Whether a deadline is at or before the latest polled instant, and so due at once:
    /// judged on the instant itself, because rounding up to the tick could put it after.
    #[inline]
    pub(crate) fn is_past(&self, deadline: Instant) -> bool {
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
    pub(crate) fn file<N: Links>(
        &mut self,
        nodes: &mut N,
        index: u32,
        deadline: u64,
        due_now: bool,
    ) {
        let location = self.location_for(deadline, due_now);
        self.link_at(nodes, index, location, deadline);
    }

    /// Appends a node that is on no list to the list at `location`.
    #[inline]
    fn link_at<N: Links>(&mut self, nodes: &mut N, index: u32, location: Location, deadline: u64) {
        let tail = self.lists.list_of(location, index).tail();
        nodes.set_links(index, location, tail, NIL);
        self.lists.link_back(nodes, location, index, deadline);
    }

    /// Takes the timer at `end` of list `sub` of the finest slot at `location`, due at
    /// `due_at`: returns it if it is due by then; otherwise it was pushed back since it was
    /// filed, and goes on to where it now belongs (after `elapsed`, which is no later than
    /// `due_at`). The list is not empty.
    fn take_due<N: Links>(
        &mut self,
        nodes: &mut N,
        list: (Location, usize),
        end: End,
        due_at: u64,
    ) -> Option<u32> {
        let index = self.unlink_end(nodes, list, end);
        let deadline = nodes.deadline(index);
        if deadline > due_at {
            self.file(nodes, index, deadline, false);
            return None;
        }
        Some(index)
    }

    /// Unlinks the first timer of the ready list and returns its index.
    #[inline]
    fn take_ready<N: Links>(&mut self, nodes: &mut N) -> Option<u32> {
        (!self.lists.ready.is_empty())
            .then(|| self.unlink_end(nodes, (Location::READY, 0), End::Head))
    }

    /// Unlinks the timer at `end` of list `sub` at `location`, which is not empty, and
    /// returns its index.
    #[inline]
    fn unlink_end<N: Links>(
        &mut self,
        nodes: &mut N,
        (location, sub): (Location, usize),
        end: End,
    ) -> u32 {
        let list = self.lists.sub_list(location, sub);
        let index = match end {
            End::Head => list.head(),
            End::Tail => list.tail(),
        };
        let (_, prev, next) = nodes.links(index);
        self.lists
            .unlink_between(nodes, location, index, (prev, next));
        // Unlinking just brought the new end into the cache: start the miss on the node
        // beyond it now, so that walking a long list keeps two misses in flight.
        let new_end = match end {
            End::Head => next,
            End::Tail => prev,
        };
        if new_end != NIL {
            let (_, before, after) = nodes.links(new_end);
            let beyond = match end {
                End::Head => after,
                End::Tail => before,
            };
            if beyond != NIL {
                nodes.prefetch(beyond);
            }
        }
        index
    }

    /// Handles an expiration other than a finest slot, now that `elapsed` has reached it.
    fn process<N: Links>(&mut self, nodes: &mut N, due: NextWork) {
        let mut timers = match due {
            // Every timer of a coarse slot, or of the overflow list, is re-filed: each lands
            // on a finer level, or on the ready list.
            NextWork::Coarse { level, slot } => {
                if self.leave_at_boundary(nodes, level, slot) {
                    return;
                }
                self.lists.take(level, slot)
            }
            NextWork::Overflow => self.lists.take_overflow(),
            NextWork::Flip => {
                // Finish moving the block's coarse slot, then let the lookahead take over
                // as the finest level (the current one is empty: its block is over).
                // `elapsed` is already the block's first tick.
                let start = self.elapsed;
                let _moved = self.fill_lookahead_block(
                    nodes,
                    start,
                    self.geometry.slot_for(start, 1),
                    usize::MAX,
                );
                if let Some(spare) = self.lists.spare0 {
                    self.lists.spare0 = Some(self.lists.current0);
                    self.lists.current0 = spare;
                }
                return;
            }
            NextWork::Finest { .. } => return,
        };
        while let Some(index) = timers.pop_front(nodes) {
            let deadline = nodes.deadline(index);
            self.file(nodes, index, deadline, false);
        }
    }

    /// Each coarse level's next occupied slot, at or after `elapsed`'s (one behind it
    /// holds the level's next rotation, moved down ahead of time), as an expiration at the
    /// slot's start: every timer on a level is in a slot that begins no earlier.
    fn coarse_candidates(&self) -> impl Iterator<Item = Expiration> + '_ {
        (1..self.geometry.levels()).filter_map(|level| {
            let occupied = self.lists.levels[level].occupied;
            if occupied == 0 {
                return None;
            }
            let slot = self.geometry.next_occupied(self.elapsed, level, occupied);
            // The current slot is occupied only by what its boundary left there, all of it
            // due after the tick by which it must have moved down.
            let tick = match self.left_at_boundary_due(level) {
                Some((due, current)) if slot == current => due.max(self.elapsed),
                _ => self.geometry.slot_start(self.elapsed, level, slot),
            };
            debug_assert!(tick >= self.elapsed, "a slot behind elapsed was skipped");
            Some(Expiration {
                kind: NextWork::Coarse { level, slot },
                tick,
            })
        })
    }

    /// No timer outside the finest level is due before this: the least, over the lookahead,
    /// every coarse level and the overflow list, of their earliest timer, each no earlier
    /// than the tick its slot (or the flip, or the epoch) begins at.
    fn later_work_earliest(&self) -> u64 {
        let lookahead = self
            .next_block()
            .filter(|_| {
                self.lists
                    .spare0
                    .is_some_and(|spare| self.lists.levels[spare].occupied != 0)
            })
            .map_or(u64::MAX, |(start, _)| start.max(self.lookahead_earliest()));
        let coarse = self
            .coarse_candidates()
            .filter_map(|due| match due.kind {
                NextWork::Coarse { level, slot } => {
                    Some(due.tick.max(self.lists.levels[level].slots[slot].earliest))
                }
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX);
        let overflow = if self.lists.overflow.is_empty() {
            u64::MAX
        } else {
            let span = self.geometry.span_bits();
            let epoch = if span >= 64 {
                0
            } else {
                (self.lists.overflow_earliest >> span) << span
            };
            epoch.max(self.lists.overflow_earliest)
        };
        lookahead.min(coarse).min(overflow)
    }

    /// The first tick of the block after the one `elapsed` is in, and the level-1 slot that
    /// holds that block's timers. At a level-2 boundary that is slot 0, which holds the
    /// next rotation's first block as far as [`pre_cascade`](Self::pre_cascade) has
    /// moved it down from level 2 (the rest cascades when the block begins); with two
    /// levels there is no such slot, and no next block to look ahead into.
    fn next_block(&self) -> Option<(u64, usize)> {
        self.lists.spare0?;
        let shift = self.geometry.shift(1);
        let block = (self.elapsed >> shift).checked_add(1)?;
        let start = block.checked_mul(1 << shift)?;
        let slot = self.geometry.slot_for(start, 1);
        (slot != 0 || self.geometry.levels() >= 3).then_some((start, slot))
    }

    /// The coarse slot that [`pre_cascade`](Self::pre_cascade) may move from at level
    /// `level` (2 or more) now: when `elapsed` is in one of the last
    /// [`pre_cascade_window`](Self::pre_cascade_window) slots of level `level - 1` under its
    /// level-`level` slot (not its first: none is behind it then), the next level-`level`
    /// slot's start and index, if its timers are on this level (at the start of a new
    /// rotation of the level above, they are there only as far as that level's own move has
    /// put them; at the top level, never: they are on the overflow list).
    fn pre_cascade_source(&self, level: usize) -> Option<(u64, usize)> {
        let slots = self.geometry.slots() as u64;
        let below = self.geometry.slot_for(self.elapsed, level - 1) as u64;
        if below == 0 || below + self.pre_cascade_window() < slots {
            return None;
        }
        self.next_coarse_slot(level)
    }

    /// The slots of a level in which [`pre_cascade`](Self::pre_cascade) moves the next
    /// slot of the level above down: [`PRE_CASCADE_SLOTS`], or all but the first on a wheel
    /// of fewer slots a level.
    fn pre_cascade_window(&self) -> u64 {
        PRE_CASCADE_SLOTS.min(self.geometry.slots() - 1) as u64
    }

    /// The start and index of the level-`level` slot after `elapsed`'s, if its timers can
    /// be on this level: not at the top level's next rotation (those are on the overflow
    /// list).
    fn next_coarse_slot(&self, level: usize) -> Option<(u64, usize)> {
        let shift = self.geometry.shift(level);
        let start = (self.elapsed >> shift)
            .checked_add(1)?
            .checked_mul(1 << shift)?;
        let slot = self.geometry.slot_for(start, level);
        (slot != 0 || level + 1 < self.geometry.levels()).then_some((start, slot))
    }

    /// Moves the next coarse slot's timers down a level ahead of time, a share per call,
    /// for every level of 2 or more whose next slot is about to begin: while `elapsed` is
    /// in one of the last [`PRE_CASCADE_SLOTS`] slots of level `L - 1` under the current
    /// level-`L` slot, the slots of level `L - 1` behind it are past and empty, so the next
    /// level-`L` slot's timers due in them can wait there (as that level's next rotation,
    /// see [`Geometry::slot_start`]) instead of all being moved down at once when their
    /// slot begins. Without this one poll at a coarse boundary moves the whole slot, however
    /// many timers it holds (the lateness bound's test). The timers due in the slots
    /// `elapsed` has not yet passed stay for a later pass; those due in the last of them,
    /// and any pushed back out of the slot, stay for the boundary, which leaves them there,
    /// to be moved down a share per poll after it (see
    /// [`leave_at_boundary`](Self::leave_at_boundary)).
    ///
    /// A walk goes along the slot's list from where the last one stopped: the last timer it
    /// left in place is its anchor (moved back to the timer before it if it leaves, see
    /// [`unlink`](Self::unlink)), so timers filed into the slot since (appended at the end)
    /// are walked too, and those left are not walked again in the same pass. When a slot of
    /// level `L - 1` passes, another pass begins from the head, over what is left, now that
    /// one more slot is behind. Coarser levels go first, so that what level `L + 1` moves
    /// into level `L`'s next slot is walked by level `L` in the same poll.
    fn pre_cascade<N: Links>(&mut self, nodes: &mut N) {
        for level in (2..self.geometry.levels()).rev() {
            let Some((start, slot)) = self.pre_cascade_source(level) else {
                continue;
            };
            let below = self.geometry.slot_for(self.elapsed, level - 1);
            let walk = self.pre_cascaded[level];
            if walk.start != start || below > walk.pass_from {
                // A slot of the level below has passed since the pass began: what it kept,
                // due in the slot just passed, can move now, behind its anchor or not.
                self.pre_cascaded[level] = PreCascade::starting(start, below);
            }
            let left = self.pre_cascade_left(level, slot);
            if left == 0 {
                continue;
            }
            let ticks_left = self
                .pre_cascade_due(level, start)
                .saturating_sub(self.elapsed);
            let budget = self.left_this_tick(level, paced_share(left, ticks_left));
            let walked = self.walk_down(nodes, level, slot, budget);
            self.count_moves(level, walked);
        }
    }

    /// Walks up to `budget` timers of level `level`'s slot `slot`, the one
    /// `pre_cascaded[level]` is walking, on from its anchor, and moves down a level those
    /// due in a slot of the level below that `elapsed` has passed (at the boundary, any
    /// but the slot's last); the rest stay, and the last of them becomes the anchor. Before
    /// the slot begins they go to that level's next rotation
    /// ([`pre_cascade`](Self::pre_cascade)); at its boundary, to where they are due from
    /// `elapsed` ([`leave_at_boundary`](Self::leave_at_boundary)), since the slot they
    /// would go to may then be the current one. Returns how many it walked.
    fn walk_down<N: Links>(
        &mut self,
        nodes: &mut N,
        level: usize,
        slot: usize,
        budget: u64,
    ) -> u64 {
        let source = Location::slot(level, slot);
        let mut state = self.pre_cascaded[level];
        let start = state.start;
        let begun = self.elapsed >= start;
        let window_end = start.saturating_add(1 << self.geometry.shift(level));
        let last = self.geometry.slots() - 1;
        // Before the boundary, timers may move into the slots of the level below that
        // `elapsed` has passed; at it, into any but the last (see `leave_at_boundary`).
        let limit = if begun {
            last
        } else {
            self.geometry.slot_for(self.elapsed, level - 1)
        };
        // The anchor is in the slot: `unlink` moves it back when it leaves.
        let mut node = match state.anchor {
            NIL => self.lists.list(source).head(),
            anchor => {
                let (location, _, next) = nodes.links(anchor);
                debug_assert_eq!(location, source, "an anchor outside its slot");
                next
            }
        };
        let mut walked = 0;
        while walked < budget && node != NIL {
            walked += 1;
            let (_, prev, next) = nodes.links(node);
            let deadline = nodes.deadline(node);
            let finer = self.geometry.slot_for(deadline, level - 1);
            if (start..window_end).contains(&deadline) && finer < limit {
                self.lists.unlink_between(nodes, source, node, (prev, next));
                if begun {
                    self.file(nodes, node, deadline, false);
                } else {
                    self.link_at(nodes, node, Location::slot(level - 1, finer), deadline);
                }
            } else {
                state.anchor = node;
                state.kept += 1;
            }
            node = next;
        }
        state.finished |= node == NIL;
        self.pre_cascaded[level] = state;
        walked
    }

    /// At level `level`'s boundary (`elapsed` at the start of its slot `slot`), moves down
    /// only the timers due before the slot's last slot of the level below, and leaves the
    /// rest in the slot, now the current one: those due in that last slot (or pushed later
    /// since) are moved a share per poll over most of the slot's time instead (see
    /// [`move_left_at_boundary`](Self::move_left_at_boundary)). What
    /// [`pre_cascade`](Self::pre_cascade) has walked is not walked again. Moving them all
    /// at the boundary took half a million list operations in one poll for a storm due
    /// about four seconds after a level-2 boundary. Returns whether it handled the slot;
    /// `false` leaves the whole slot to be moved now: at a boundary too close to the
    /// slot's end to pace anything, or when the time to move what was left has come.
    fn leave_at_boundary<N: Links>(&mut self, nodes: &mut N, level: usize, slot: usize) -> bool {
        if level < 2 || slot != self.geometry.slot_for(self.elapsed, level) {
            return false;
        }
        let start = self.geometry.slot_start(self.elapsed, level, slot);
        if start != self.elapsed
            || self.left_at_boundary[level] == start
            || self.move_down_by(level, start) <= self.elapsed
        {
            return false;
        }
        // What is unwalked: everything after the anchor, or the whole slot when the moves
        // ahead of time had no poll to walk it in (a storm armed the tick before the
        // boundary). This poll still reads each of those timers, but moves only the ones
        // due sooner.
        let last = self.geometry.slots() - 1;
        let walk = self.pre_cascaded[level];
        if walk.start != start || walk.pass_from != last {
            // What an earlier pass left, due in the window's last slots but one, is walked
            // again, as is everything when no pass came.
            self.pre_cascaded[level] = PreCascade::starting(start, last);
        }
        self.walk_down(nodes, level, slot, u64::MAX);
        self.pre_cascaded[level] = PreCascade::starting(u64::MAX, 0);
        self.left_at_boundary[level] = start;
        true
    }

    /// The tick by which the timers level `level`'s boundary left in its slot beginning at
    /// `start` must all have moved down: a slot of the level below before the last one,
    /// where they are due, so that the moves ahead of time into that slot's own block
    /// (or its level's next rotation) find them all there.
    fn move_down_by(&self, level: usize, start: u64) -> u64 {
        let below = self.geometry.shift(level - 1);
        let slots_before = (self.geometry.slots() as u64).saturating_sub(2);
        start.saturating_add(slots_before << below)
    }

    /// While level `level`'s current slot holds timers its boundary left there: the tick
    /// by which they must have moved down ([`move_down_by`](Self::move_down_by)), and the
    /// slot.
    fn left_at_boundary_due(&self, level: usize) -> Option<(u64, usize)> {
        let start = *self.left_at_boundary.get(level)?;
        if start == u64::MAX {
            return None;
        }
        let slot = self.geometry.slot_for(self.elapsed, level);
        let current = self.geometry.slot_start(self.elapsed, level, slot) == start;
        (current && self.lists.levels[level].occupied & (1 << slot) != 0)
            .then(|| (self.move_down_by(level, start), slot))
    }

    /// Moves down a share of the timers each level's boundary left in its current slot
    /// (see [`leave_at_boundary`](Self::leave_at_boundary)), at the pace of moves ahead
    /// of time: twice the share of what is left per tick left, per poll, or per tick in a
    /// tick that has handed out due timers.
    fn move_left_at_boundary<N: Links>(&mut self, nodes: &mut N) {
        for level in 2..self.geometry.levels() {
            let Some((due, slot)) = self.left_at_boundary_due(level) else {
                continue;
            };
            let source = Location::slot(level, slot);
            let left = u64::from(self.lists.levels[level].slots[slot].timers.len());
            let budget =
                self.left_this_tick(level, paced_share(left, due.saturating_sub(self.elapsed)));
            let mut moved = 0;
            while moved < budget {
                let node = self.lists.list(source).head();
                if node == NIL {
                    break;
                }
                self.unlink(nodes, node);
                let deadline = nodes.deadline(node);
                self.file(nodes, node, deadline, false);
                moved += 1;
            }
            self.count_moves(level, moved);
        }
    }

    /// When timers left at a boundary are more than one poll should move at once: the tick
    /// by which polls should start moving them, at [`FILL_PER_TICK`]'s pace. That counts
    /// the timers a coming boundary will leave, those [`pre_cascade`](Self::pre_cascade)
    /// has walked and kept: nothing may be due until their block, and an owner sleeping
    /// until then would cross the boundary and move them all in its first poll.
    fn left_at_boundary_tick(&self) -> Option<u64> {
        (2..self.geometry.levels())
            .filter_map(|level| {
                let (due, left, earliest) = match self.left_at_boundary_due(level) {
                    Some((due, slot)) => {
                        let left = self.lists.levels[level].slots[slot].timers.len();
                        (due, u64::from(left), self.elapsed)
                    }
                    None => {
                        let (start, _) = self.next_coarse_slot(level)?;
                        let walk = &self.pre_cascaded[level];
                        if walk.start != start {
                            return None;
                        }
                        (self.move_down_by(level, start), walk.kept, start)
                    }
                };
                (left > LOOKAHEAD_BUDGET as u64).then(|| self.first_move_tick(due, left, earliest))
            })
            .min()
    }

    /// What is left of `share`, the timers level `level`'s moves ahead of time may take
    /// in a tick, in the current one if it has handed out due timers (see
    /// [`moved_in_tick`](Self::moved_in_tick)); `share` otherwise.
    fn left_this_tick(&self, level: usize, share: u64) -> u64 {
        match self.moved_in_tick.get(level) {
            Some(&(tick, moved)) if tick == self.elapsed && self.handed_out_at == tick => {
                share.saturating_sub(moved)
            }
            _ => share,
        }
    }

    /// Counts `moved` timers moved (or walked) ahead of time out of level `level`'s next
    /// slot in the current tick.
    fn count_moves(&mut self, level: usize, moved: u64) {
        let elapsed = self.elapsed;
        if let Some(entry) = self.moved_in_tick.get_mut(level) {
            if entry.0 != elapsed {
                *entry = (elapsed, 0);
            }
            entry.1 = entry.1.saturating_add(moved);
        }
    }

    /// The tick by which [`pre_cascade`](Self::pre_cascade) should have moved level
    /// `level`'s slot beginning at `start`: the level below's window earlier
    /// ([`PRE_CASCADE_SLOTS`] of its own slots below it), so that the level below's own
    /// walk (of the slot this one fills), which starts then, finds all of it; for level 2,
    /// the tick before the slot (the lookahead's fill of the first block runs beside it).
    fn pre_cascade_due(&self, level: usize, start: u64) -> u64 {
        let window = if level > 2 {
            self.pre_cascade_window()
        } else {
            1
        };
        start.saturating_sub(window << self.geometry.shift(level - 2))
    }

    /// Timers of level `level`'s slot `slot` that [`pre_cascade`](Self::pre_cascade) has
    /// not yet walked: its length less those it left in place (an estimate once some of
    /// those are cancelled: it then walks less ahead of time, and the rest moves at the
    /// slot's start, as it would have anyway).
    fn pre_cascade_left(&self, level: usize, slot: usize) -> u64 {
        let len = u64::from(self.lists.levels[level].slots[slot].timers.len());
        let state = &self.pre_cascaded[level];
        len.saturating_sub(state.kept)
    }

    /// When a coarse slot of more than the move at its start should do at once comes up
    /// for [`pre_cascade`](Self::pre_cascade): the tick by which polls should start
    /// moving it, at [`FILL_PER_TICK`]'s pace, but not before `elapsed` reaches the first
    /// of the last [`PRE_CASCADE_SLOTS`] slots of the level below (or, when a pass has
    /// walked the whole slot, the next slot of the level below, which begins the next
    /// pass), and never before the next tick.
    /// A slot whose timers can never fire (all at the end of the tick range) asks for none.
    fn pre_cascade_tick(&self) -> Option<u64> {
        (2..self.geometry.levels())
            .filter_map(|level| {
                let (start, left, earliest) = self.next_big_coarse_slot(level)?;
                Some(self.first_move_tick(self.pre_cascade_due(level, start), left, earliest))
            })
            .min()
    }

    /// The first of level `level`'s slots after the current one with more timers left to
    /// move ahead of time than the boundary should move at once, and how many: its start
    /// and count. Not only the next slot: an owner that polls only when asked, with
    /// nothing due before a storm two or more slots ahead, would otherwise sleep until
    /// the storm's slot begins and move it all in that poll. A slot whose timers can never
    /// fire (all at the end of the tick range) asks for nothing.
    fn next_big_coarse_slot(&self, level: usize) -> Option<(u64, u64, u64)> {
        let current = self.geometry.slot_for(self.elapsed, level);
        let mut occupied = self.lists.levels[level].occupied & !(1 << current);
        while occupied != 0 {
            let slot = self.geometry.next_occupied(self.elapsed, level, occupied);
            occupied &= !(1 << slot);
            // Behind the current slot is the level's next rotation, moved down ahead of
            // time (never at the top level, whose next rotation is on the overflow list).
            let start = self.geometry.slot_start(self.elapsed, level, slot);
            let state = &self.lists.levels[level].slots[slot];
            if state.earliest == NEVER {
                continue;
            }
            let (left, earliest) = self.pre_cascade_plan(level, slot, start);
            if left > LOOKAHEAD_BUDGET as u64 {
                return Some((start, left, earliest));
            }
        }
        None
    }

    /// For level `level`'s slot `slot` beginning at `start`: the timers
    /// [`pre_cascade`](Self::pre_cascade) has yet to walk, and the tick from which it can
    /// walk them. Before the last slot of the level below, every timer the slot holds is
    /// walked again by some pass (what a pass keeps moves in a later one), from the start
    /// of the window, or, when a pass has walked it all and only its kept timers wait, from
    /// the next slot of the level below, which begins the next pass. In the last slot,
    /// what the final pass has not walked (timers filed since included), from now: what it
    /// keeps stays for the boundary.
    fn pre_cascade_plan(&self, level: usize, slot: usize, start: u64) -> (u64, u64) {
        let slots = self.geometry.slots();
        let width = 1_u64 << self.geometry.shift(level - 1);
        let window_start = start.saturating_sub(self.pre_cascade_window() * width);
        let len = u64::from(self.lists.levels[level].slots[slot].timers.len());
        let walk = &self.pre_cascaded[level];
        if walk.start != start {
            return (len, window_start);
        }
        let unwalked = self.pre_cascade_left(level, slot);
        if walk.pass_from + 1 >= slots {
            return (unwalked, window_start);
        }
        if walk.finished && unwalked <= LOOKAHEAD_BUDGET as u64 {
            let this_slot = start - slots as u64 * width;
            return (len, this_slot + (walk.pass_from as u64 + 1) * width);
        }
        (len, window_start)
    }

    /// Moves up to `budget` timers from the next block's level-1 slot into the lookahead,
    /// each into the finest slot of its own tick. Timers pushed back out of the block by a
    /// lazy reset are re-filed where they now belong.
    fn fill_lookahead<N: Links>(&mut self, nodes: &mut N, budget: usize) {
        if let Some((start, slot)) = self.next_block() {
            let moved = self.fill_lookahead_block(nodes, start, slot, budget);
            self.count_moves(1, moved as u64);
        }
    }

    /// The next block's start and the timers of its coarse slot not yet in the lookahead,
    /// if there are any.
    fn lookahead_left(&self) -> Option<(u64, u64)> {
        let (start, slot) = self.next_block()?;
        let left = u64::from(self.lists.levels[1].slots[slot].timers.len());
        (left > 0).then_some((start, left))
    }

    /// How many timers a poll that finds nothing due moves into the lookahead: what is
    /// left, in this tick, of twice its share of what is left over the ticks before the
    /// next block, and never fewer than [`LOOKAHEAD_BUDGET`] a tick.
    fn fill_budget(&self) -> usize {
        let share = match self.lookahead_left() {
            Some((start, left)) => paced_share(left, start.saturating_sub(self.elapsed)),
            None => LOOKAHEAD_BUDGET as u64,
        };
        usize::try_from(self.left_this_tick(1, share)).unwrap_or(usize::MAX)
    }

    /// When the next block's coarse slot holds more than the flip should move at once: the
    /// tick by which polls should start moving it, never before the next tick.
    fn fill_tick(&self) -> Option<u64> {
        let (start, left) = self.lookahead_left()?;
        if left <= LOOKAHEAD_BUDGET as u64 {
            return None;
        }
        Some(self.first_move_tick(start, left, 0))
    }

    /// When the wheel would sleep past the block before a coarse level-1 slot that holds
    /// more than the flip should move at once: a tick in that block, early enough for
    /// [`fill_tick`](Self::fill_tick)'s pace, so that the slot is moved into the lookahead
    /// rather than all at once when the block begins. Never before the next tick.
    fn pre_block_tick(&self) -> Option<u64> {
        self.lists.spare0?;
        let level = &self.lists.levels[1];
        if level.occupied == 0 {
            return None;
        }
        let slot = self.geometry.next_occupied(self.elapsed, 1, level.occupied);
        let start = self.geometry.slot_start(self.elapsed, 1, slot);
        let left = u64::from(level.slots[slot].timers.len());
        if left <= LOOKAHEAD_BUDGET as u64 || start <= self.elapsed {
            return None;
        }
        let block = 1_u64 << self.geometry.shift(1);
        Some(self.first_move_tick(start, left, start - (block - 1)))
    }

    /// The tick of the first poll that should move `left` timers ahead of time, to be done
    /// by `due` at [`FILL_PER_TICK`]'s pace: no earlier than `earliest` (where the move
    /// can first start), and never before the next tick.
    fn first_move_tick(&self, due: u64, left: u64, earliest: u64) -> u64 {
        due.saturating_sub(left.div_ceil(FILL_PER_TICK))
            .max(earliest)
            .max(self.elapsed.saturating_add(1))
    }

    /// Moves up to `budget` timers of the block beginning at `start`, from level-1 slot
    /// `slot` into the lookahead. Returns how many it moved.
    fn fill_lookahead_block<N: Links>(
        &mut self,
        nodes: &mut N,
        start: u64,
        slot: usize,
        budget: usize,
    ) -> usize {
        let Some(spare) = self.lists.spare0 else {
            return 0;
        };
        let shift = self.geometry.shift(1);
        let mut moved = 0;
        for _ in 0..budget {
            let Some(index) = self.lists.levels[1].slots[slot].timers.pop_front(nodes) else {
                break;
            };
            moved += 1;
            let deadline = nodes.deadline(index);
            if deadline >> shift == start >> shift {
                let location = Location::slot(spare, self.geometry.slot_for(deadline, 0));
                self.link_at(nodes, index, location, deadline);
            } else {
                self.file(nodes, index, deadline, false);
            }
        }
        if self.lists.levels[1].slots[slot].timers.is_empty() {
            self.lists.mark_empty(1, slot);
        }
        moved
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

    /// The next thing to process, and the tick it begins at: a coarse slot whose start
    /// `elapsed` has reached, else the finest level's next slot in the current block (or
    /// the flip to the lookahead), else the coarse slot that begins first, else the
    /// overflow list's epoch.
    #[inline]
    fn next_expiration(&self) -> Option<Expiration> {
        // A coarse slot whose start `elapsed` has reached goes before anything else: with
        // slots moved down ahead of time several coarse slots can begin at one tick (a
        // level-2 slot's leftovers and the level-1 slot its timers were moved into), and
        // handling one of them moves `elapsed` there, leaving the others in slots that are
        // now current. Nothing else files into a current slot, so this finds only those,
        // and they wait where `elapsed` was moved to, their start: a block's first tick.
        // Elsewhere the look is skipped, which keeps it off the path each due timer takes
        // (debug builds look anyway, and check that).
        let at_block_start = self.elapsed & ((1 << self.geometry.shift(1)) - 1) == 0;
        if at_block_start || cfg!(debug_assertions) {
            for level in 1..self.geometry.levels() {
                let slot = self.geometry.slot_for(self.elapsed, level);
                if self.lists.levels[level].occupied & (1 << slot) != 0
                    && self
                        .left_at_boundary_due(level)
                        .is_none_or(|(due, _)| due <= self.elapsed)
                {
                    debug_assert!(at_block_start, "a current coarse slot inside a block");
                    return Some(Expiration {
                        kind: NextWork::Coarse { level, slot },
                        tick: self.elapsed,
                    });
                }
            }
        }
        let finest = &self.lists.levels[self.lists.current0];
        if finest.occupied != 0 {
            // Every finest slot is in the current block, before any coarse slot begins.
            let slot = self
                .geometry
                .next_occupied(self.elapsed, 0, finest.occupied);
            let tick = self.geometry.slot_start(self.elapsed, 0, slot);
            return Some(Expiration {
                kind: NextWork::Finest { slot },
                tick,
            });
        }
        // The lookahead's timers belong to the next block, after every finest slot and
        // before (or with, at a tie) any coarse slot that begins later: the flip goes first.
        let lookahead = self.lists.spare0.map(|spare| &self.lists.levels[spare]);
        if lookahead.is_some_and(|state| state.occupied != 0) {
            // Only ever filled for a next block that exists.
            if let Some((start, _)) = self.next_block() {
                return Some(Expiration {
                    kind: NextWork::Flip,
                    tick: start,
                });
            }
            debug_assert!(false, "a lookahead without a next block");
        }
        if let Some(coarse) = self.coarse_candidates().min_by_key(|due| due.tick) {
            return Some(coarse);
        }
        if self.lists.overflow.is_empty() {
            return None;
        }
        // Overflow timers are filed into the levels at the start of their epoch, the first
        // tick whose digits above the levels' span match theirs.
        let span = self.geometry.span_bits();
        Some(Expiration {
            kind: NextWork::Overflow,
            tick: (self.lists.overflow_earliest >> span) << span,
        })
    }
}
