//! Lists of due timers a shard's wheel hands out, so that several workers claim a burst at once:
//! walking a due slot's list is a chain of cache misses, which bounds one core however many workers
//! stand ready. When a look finds more due than its run queue holds, the wheel's holder takes the
//! due slots' lists whole ([`WheelCore::detach_due`](crate::wheel::core::WheelCore::detach_due))
//! and hands them out here; the owner and idle workers each take a few lists, walk them from both
//! ends, claim each due timer and run what they claimed.
//!
//! The protocol:
//! - A handed-out list belongs to whoever holds its bit in `open`: the wheel's holder sets it, a
//!   walker takes it with a `fetch_and`. A walker walks at most [`WALK_BATCH`] timers, then gives
//!   each list back (in `open` if timers are left, in `done` if not), and only then runs what it
//!   claimed, so a blocking callback holds no list.
//! - A walker claims as the wheel's holder does ([`TimerNode::claim`]); a timer locked by a reset
//!   or not due goes on its list's returned chain, for the holder to refile.
//! - While any list is out, the wheel's holder receives and files nothing (a message would unlink a
//!   timer from a list the wheel no longer holds); its looks wait until every list is `done`, then
//!   refile the returned chains.
//! - A walker is in the shard's hands (`enter_hands`) from taking lists to running what it claimed,
//!   so the last turn waits for it, then takes back every list.

use crossbeam_utils::CachePadded;

use crate::engine::pool::Pool;
use crate::engine::timer_node::{Claim, TimerNode};
use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
pub(crate) use crate::tuning::{LISTS, WALK_BATCH, WALK_LISTS};
use crate::wheel::location::NIL;

/// A shard's handed-out lists.
pub(crate) struct DueLists {
    flags: CachePadded<Flags>,
    lists: Box<[HandedList]>,
}

struct Flags {
    /// Bit `i`: list `i` has timers left and nobody walks it.
    open: AtomicU64,
    /// Bit `i`: list `i` has been walked to the end, and its returned chain is final.
    done: AtomicU64,
    /// The tick the lists were handed out at: a timer on them is due if due by then.
    due: AtomicU64,
}

/// What is left of a list, `head` to `tail` (both `NIL` once walked), and the timers sent back,
/// chained through `next`. Relaxed: handing a list over (`open`, `done`) orders them.
struct HandedList {
    head: AtomicU32,
    tail: AtomicU32,
    returned: AtomicU32,
}

#[derive(Clone, Copy)]
enum End {
    Head,
    Tail,
}

#[derive(Clone, Copy)]
struct Walk {
    list: usize,
    head: u32,
    tail: u32,
    returned: u32,
}

impl Walk {
    fn is_over(&self) -> bool {
        self.head == NIL
    }

    /// Takes the timer at `end` and prefetches the one after the new end: two misses in flight per
    /// end.
    fn take(&mut self, pool: &Pool, end: End) -> u32 {
        let inward = |prev, next| match end {
            End::Head => next,
            End::Tail => prev,
        };
        let index = inward(self.tail, self.head);
        if self.head == self.tail {
            (self.head, self.tail) = (NIL, NIL);
            return index;
        }
        let (_, prev, next) = links_of(pool, index);
        let new_end = inward(prev, next);
        match end {
            End::Head => self.head = new_end,
            End::Tail => self.tail = new_end,
        }
        let (_, before, after) = links_of(pool, new_end);
        if let Some(node) = pool.node(inward(before, after)) {
            TimerNode::prefetch_for_write(std::ptr::NonNull::from(node));
        }
        index
    }

    /// Puts a timer taken off this list on its returned chain.
    fn send_back(&mut self, pool: &Pool, index: u32) {
        if let Some(node) = pool.node(index) {
            // SAFETY: ground rule 2: this walker holds the list and took the timer off it.
            unsafe { node.with_links(|links| links.set_next(self.returned)) };
            self.returned = index;
        }
    }
}

fn links_of(pool: &Pool, index: u32) -> (crate::wheel::location::Location, u32, u32) {
    match pool.node(index) {
        // SAFETY: ground rule 2: the caller holds the node's list, or the wheel.
        Some(node) => unsafe { node.with_links(|links| links.links()) },
        None => unreachable!("a handed-out index outside its pool"),
    }
}

impl DueLists {
    pub(crate) fn new() -> Self {
        Self {
            flags: CachePadded::new(Flags {
                open: AtomicU64::new(0),
                done: AtomicU64::new(0),
                due: AtomicU64::new(0),
            }),
            lists: (0..LISTS)
                .map(|_| HandedList {
                    head: AtomicU32::new(NIL),
                    tail: AtomicU32::new(NIL),
                    returned: AtomicU32::new(NIL),
                })
                .collect(),
        }
    }

    /// Whether a list waits for a walker (a hint).
    pub(crate) fn is_open(&self) -> bool {
        self.flags.open.load(Ordering::SeqCst) != 0
    }

    /// The wheel's holder hands out `lists` (head and tail, none empty), due by `due`, while none
    /// is out. Returns their bits.
    pub(crate) fn hand_out(&self, lists: &[(u32, u32)], due: u64) -> u64 {
        debug_assert!(lists.len() <= LISTS && !lists.is_empty());
        for (list, &(head, tail)) in self.lists.iter().zip(lists) {
            list.head.store(head, Ordering::Relaxed);
            list.tail.store(tail, Ordering::Relaxed);
            list.returned.store(NIL, Ordering::Relaxed);
        }
        let bits = u64::MAX >> (u64::BITS as usize - lists.len());
        self.flags.due.store(due, Ordering::Relaxed);
        // Release: a walker sees the lists' links. SeqCst: against a worker going to sleep (see
        // `IdleWorkers::begin_idle`).
        self.flags.open.fetch_or(bits, Ordering::SeqCst);
        bits
    }

    /// Whether every list of `handed` has been walked to the end.
    pub(crate) fn all_back(&self, handed: u64) -> bool {
        // Acquire: the last walker's returned chain and links.
        self.flags.done.load(Ordering::Acquire) & handed == handed
    }

    /// The wheel's holder takes back the lists of `handed`, calling `refile` on every timer left or
    /// sent back. Each is walked to the end ([`all_back`](Self::all_back)), or it is the last turn,
    /// which waited for the walkers.
    pub(crate) fn take_back(&self, handed: u64, pool: &Pool, mut refile: impl FnMut(u32)) {
        for (position, list) in self.lists.iter().enumerate() {
            if handed & (1 << position) == 0 {
                continue;
            }
            let tail = list.tail.load(Ordering::Relaxed);
            for (mut index, last) in [
                (list.head.load(Ordering::Relaxed), tail),
                (list.returned.load(Ordering::Relaxed), NIL),
            ] {
                while index != NIL {
                    // Read before `refile` writes the node's links.
                    let next = if index == last {
                        NIL
                    } else {
                        links_of(pool, index).2
                    };
                    refile(index);
                    index = next;
                }
            }
        }
        self.flags.open.fetch_and(!handed, Ordering::Relaxed);
        self.flags.done.fetch_and(!handed, Ordering::Relaxed);
    }

    /// Takes up to [`WALK_LISTS`] open lists from list `from` on, claims the due timers among the
    /// next `out.len()` into `out`, and gives the lists back. Returns how many it claimed and the
    /// tick they were due by; `None` if no list was open.
    pub(crate) fn walk(&self, pool: &Pool, out: &mut [u32], from: usize) -> Option<(usize, u64)> {
        let mine = loop {
            let open = self.flags.open.load(Ordering::Relaxed);
            if open == 0 {
                return None;
            }
            let pick = first_open(open, from);
            // Acquire: the ends and links its last holder left.
            let mine = self.flags.open.fetch_and(!pick, Ordering::Acquire) & pick;
            if mine != 0 {
                break mine;
            }
        };
        let due = self.flags.due.load(Ordering::Relaxed);
        let mut walks = [Walk {
            list: 0,
            head: NIL,
            tail: NIL,
            returned: NIL,
        }; WALK_LISTS];
        let mut count = 0;
        for (position, list) in self.lists.iter().enumerate() {
            if mine & (1 << position) != 0 {
                walks[count] = Walk {
                    list: position,
                    head: list.head.load(Ordering::Relaxed),
                    tail: list.tail.load(Ordering::Relaxed),
                    returned: list.returned.load(Ordering::Relaxed),
                };
                count += 1;
            }
        }
        let mut claimed = 0;
        let mut walked = 0;
        let mut going = true;
        while going {
            going = false;
            for walk in &mut walks[..count] {
                for end in [End::Head, End::Tail] {
                    if walk.is_over() || walked == out.len() {
                        continue;
                    }
                    going = true;
                    walked += 1;
                    let index = walk.take(pool, end);
                    let Some(node) = pool.node(index) else {
                        continue;
                    };
                    match node.claim(due) {
                        Claim::Fired => {
                            out[claimed] = index;
                            claimed += 1;
                        }
                        Claim::Cancelled => {}
                        Claim::Refile(_) => walk.send_back(pool, index),
                    }
                }
            }
        }
        let (mut reopen, mut finished) = (0_u64, 0_u64);
        for walk in &walks[..count] {
            let list = &self.lists[walk.list];
            list.head.store(walk.head, Ordering::Relaxed);
            list.tail.store(walk.tail, Ordering::Relaxed);
            list.returned.store(walk.returned, Ordering::Relaxed);
            if walk.is_over() {
                finished |= 1 << walk.list;
            } else {
                reopen |= 1 << walk.list;
            }
        }
        // Release: the next holder sees the ends, the returned chain and its links.
        if finished != 0 {
            self.flags.done.fetch_or(finished, Ordering::Release);
        }
        if reopen != 0 {
            self.flags.open.fetch_or(reopen, Ordering::Release);
        }
        Some((claimed, due))
    }
}

/// Up to [`WALK_LISTS`] of the lists in `open`, from list `from` on (wrapping), so that walkers
/// seldom reach for the same ones.
fn first_open(open: u64, from: usize) -> u64 {
    let turn = (from % LISTS) as u32;
    let mut rest = open.rotate_right(turn);
    let mut pick = 0_u64;
    for _ in 0..WALK_LISTS {
        if rest == 0 {
            break;
        }
        let lowest = rest & rest.wrapping_neg();
        pick |= lowest;
        rest &= !lowest;
    }
    pick.rotate_left(turn)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::engine::runner;
    use crate::{Clock, ManualClock, PendingTimers, TimerEngine};

    const TICK: Duration = Duration::from_millis(1);
    /// Two timers on each of a due slot's eight lists: walkers read and write links.
    const TIMERS: usize = 16;

    /// A walker takes at most four open lists, the first at or after its own start,
    /// wrapping past the last list.
    #[test]
    fn a_walker_picks_up_to_four_open_lists_from_its_start() {
        use super::first_open;
        assert_eq!(first_open(0, 5), 0);
        assert_eq!(first_open(u64::MAX, 0), 0b1111);
        assert_eq!(first_open(u64::MAX, 8), 0b1111 << 8);
        // From 62 on: 62, 63, then 0 and 1.
        assert_eq!(first_open(u64::MAX, 62), (0b11 << 62) | 0b11);
        // Only the open ones, skipping closed ones on the way.
        assert_eq!(first_open(0b1010_0001, 1), 0b1010_0001);
        assert_eq!(first_open(1 << 40, 41), 1 << 40);
        // A start beyond the lists wraps.
        assert_eq!(first_open(u64::MAX, 64 + 4), 0b1111 << 4);
    }

    /// Walks shard 0's lists until none is open, running what it claims; returns the runs.
    fn walk_all(engine: &TimerEngine) -> usize {
        let shared = engine.shared();
        let shard = &shared.shards[0];
        let mut ran = 0;
        while shard.walk_hand_outs(&shared.shutdown, 0, |batch, due| {
            ran += runner::run(shard, batch, due, false);
        }) {}
        ran
    }

    /// A due slot of sixteen timers, filed, is handed out; two threads and this one walk
    /// it while this one cancels a quarter of the timers and pushes another quarter back.
    /// The owner's next look takes the lists back and receives the messages: every timer
    /// runs once unless its cancel returned `true`, none before its deadline, and every
    /// node comes back.
    #[test]
    fn walkers_a_cancel_and_a_reset_settle_every_timer_once() {
        let clock = ManualClock::new();
        let engine = Arc::new(
            TimerEngine::builder()
                .workers(1)
                .tick(TICK)
                .manual_clock(clock.clone())
                .build()
                .expect("a manual engine starts no threads"),
        );
        let origin = clock.now();
        let runs: Arc<Vec<AtomicUsize>> =
            Arc::new((0..TIMERS).map(|_| AtomicUsize::new(0)).collect());
        let at: Arc<Vec<AtomicU64>> = Arc::new((0..TIMERS).map(|_| AtomicU64::new(0)).collect());
        let handles: Vec<_> = (0..TIMERS)
            .map(|id| {
                let (runs, at, clock) = (Arc::clone(&runs), Arc::clone(&at), clock.clone());
                let handle = engine
                    .schedule(TICK, move || {
                        runs[id].fetch_add(1, Ordering::SeqCst);
                        let now = clock.now().duration_since(origin).as_nanos() as u64;
                        at[id].store(now, Ordering::SeqCst);
                    })
                    .expect("the engine is running");
                // Out due in a tick, filed by that tick's turn at three.
                assert!(engine.reset(handle, 3 * TICK));
                handle
            })
            .collect();
        clock.advance(TICK);
        assert_eq!(engine.turn(), 0, "filed, not yet due");
        clock.advance(2 * TICK);
        let shared = engine.shared();
        let shard = &shared.shards[0];
        let now = clock.now();
        assert!(shard.with_wheel_waiting(|wheel| wheel.hand_out_now(shard, now)));
        let walkers: Vec<_> = (0..2)
            .map(|_| {
                let engine = Arc::clone(&engine);
                std::thread::spawn(move || walk_all(&engine))
            })
            .collect();
        let mut cancelled = [false; TIMERS];
        let mut deadline = [3 * TICK; TIMERS];
        for id in 0..TIMERS {
            match id % 4 {
                0 => cancelled[id] = engine.cancel(handles[id]),
                1 if engine.reset(handles[id], 2 * TICK) => deadline[id] = 5 * TICK,
                _ => {}
            }
        }
        let mut ran = walk_all(&engine);
        ran += walkers
            .into_iter()
            .map(|walker| walker.join().expect("a walker panicked"))
            .sum::<usize>();
        // The look takes the lists back; what was pushed back waits for its deadline.
        ran += engine.turn();
        for _ in 0..40 {
            clock.advance(TICK);
            ran += engine.turn();
        }
        let expected = cancelled.iter().filter(|&&cancelled| !cancelled).count();
        assert_eq!(ran, expected);
        for id in 0..TIMERS {
            let runs = runs[id].load(Ordering::SeqCst);
            assert_eq!(
                runs,
                usize::from(!cancelled[id]),
                "timer {id} ran {runs} times"
            );
            if runs == 1 {
                let at = at[id].load(Ordering::SeqCst);
                assert!(
                    at >= deadline[id].as_nanos() as u64,
                    "timer {id} ran early at {at} ns"
                );
            }
        }
        let report = engine.shutdown(PendingTimers::Drop);
        assert_eq!(report.dropped, 0);
        assert_eq!(engine.nodes_in_use(), 0, "a node was not given back");
    }
}
