//! Growth of a shard's pool of timer nodes (`src/engine/pool.rs`):
//!
//! - A refill at the size limit (`take_any_word`, reached only after `grow` found the
//!   region used up) waits for every chunk to be settled (its free bits given to the
//!   bitmap) before it reports the pool full: no capacity error while a chunk's nodes are
//!   about to be given, and the wait always ends.
//! - A refill that finds no word half free near the cursor grows the pool while fewer than
//!   an eighth of its nodes are free in the bitmap: the pool's memory beyond its pending
//!   timers stays about an eighth of the pool plus what threads hold in their magazines;
//!   it never grows without bound; nodes are never handed out twice or lost; timers fire
//!   exactly once, never early.
//!
//! From the public API: an adversary on the manual clock that knows every node's index
//! (from a handle's `Debug`) and cancels timers so that the pool's free nodes lie spread as
//! thinly as it likes (a fixed number of holes in every word, just under half, or just
//! under an eighth), at a fixed number of live timers; a ring of mixed long and short
//! timers whose short ones leave each word less than half free; a real-clock ring of
//! request timeouts where most are cancelled and a fraction fire; many threads racing the
//! carving of a pool's last chunks where the pool holds exactly what they need (any
//! capacity error is then spurious); many threads at the size limit arming, cancelling and
//! firing; shutdown and engine drop racing refills at the size limit; threads exiting while
//! others spin on a full pool.
//!
//! The ignored test records a limit: free nodes idle in other threads' magazines are
//! invisible to a refill. On the real clock with a starved worker, cancelled nodes waiting
//! to be reclaimed (not pending, not free) can outnumber pending timers several times
//! over; the pool follows them, which is the lanes' reclaim latency, not the growth rule.

use crate::support;

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::support::pool_attack::{
    ArmShape, CHUNK, LIMIT, Outcomes, arm_until_full, manual_engine, pool_nodes, race_arms,
    real_engine, slot,
};
use crate::support::{Live, Rng, eventually, ms, within};
use corewheel::{Clock, ManualClock, PendingTimers, ScheduleError, TimerEngine, TimerHandle};

/// Nodes per bitmap word: the most one refill takes.
const WORD: usize = 64;

/// The most free nodes one producer thread keeps in its magazine for a shard: up to
/// `MAGAZINE_LIMIT` (4 words) of its own recycled nodes plus one word taken whole.
const MAGAZINE_MAX: usize = 4 * WORD + WORD;

/// The node index a handle names.
fn index(handle: TimerHandle) -> usize {
    slot(handle).1 as usize
}

/// The most nodes the growth rule may carve for `live` timers pending at most (plus
/// `held` free nodes outside the bitmap): it grows only while fewer than an eighth of
/// its nodes are free in the bitmap, or, in a pool under 16 chunks, while fewer than
/// two chunks are (`PLENTY_FREE`); one chunk more for the growth that crosses the line,
/// and `slack` chunks for honest margin (refills that grow together).
fn growth_bound(live: usize, held: usize, slack: usize) -> usize {
    let need = live + held;
    (need * 8 / 7).max(need + 2 * CHUNK) + (1 + slack) * CHUNK
}

// ---------------------------------------------------------------------------------------
// The growth rule against an adversary that places the holes.
// ---------------------------------------------------------------------------------------

/// What the adversary tracks: the live timers by node index, and how many nodes of each
/// word hold no live timer of its own.
struct Board {
    by_index: Vec<Option<TimerHandle>>,
}

impl Board {
    fn add(&mut self, handle: TimerHandle) {
        let at = index(handle);
        if at >= self.by_index.len() {
            self.by_index.resize(at + 1, None);
        }
        assert!(
            self.by_index[at].replace(handle).is_none(),
            "node {at} handed to two live timers"
        );
    }

    fn live_in_word(&self, word: usize) -> usize {
        let end = ((word + 1) * WORD).min(self.by_index.len());
        self.by_index[word * WORD..end]
            .iter()
            .filter(|h| h.is_some())
            .count()
    }

    /// Takes a live timer of `word`, if it has one.
    fn take_in_word(&mut self, word: usize, rng: &mut Rng) -> Option<TimerHandle> {
        let end = ((word + 1) * WORD).min(self.by_index.len());
        let live: Vec<usize> = (word * WORD..end)
            .filter(|&i| self.by_index[i].is_some())
            .collect();
        let at = *live.get(rng.below(live.len() as u64) as usize)?;
        self.by_index[at].take()
    }
}

/// Keeps `live` timers of an hour pending on one shard, and for `rounds` rounds cancels
/// 64 of them and arms 64 new ones, choosing each cancel so that every word of the pool
/// has at most `holes` nodes free (cancelling in the word with the fewest holes once
/// every word has that many): the free nodes then lie spread as thinly as the adversary
/// likes. Returns the pool's peak size.
fn thin_holes(live: usize, holes: usize, rounds: usize, seed: u64) -> usize {
    let (engine, clock) = manual_engine(1 << 20);
    let mut rng = Rng(seed);
    let mut board = Board {
        by_index: Vec::new(),
    };
    for _ in 0..live {
        board.add(engine.schedule(Duration::from_secs(3600), || {}).unwrap());
    }
    clock.advance(ms(1));
    engine.turn();
    let mut peak = pool_nodes(&engine);
    let mut cursor = 0;
    for round in 0..rounds {
        let words = pool_nodes(&engine) / WORD;
        board.by_index.resize(words * WORD, None);
        let mut cancelled = 0;
        let mut tried = 0;
        // Round robin over the words, skipping those that already have `holes` free.
        while cancelled < WORD && tried < words {
            let word = cursor % words;
            cursor += 7;
            if WORD - board.live_in_word(word) >= holes {
                tried += 1;
                continue;
            }
            if let Some(handle) = board.take_in_word(word, &mut rng) {
                assert!(engine.cancel(handle), "a live timer");
                cancelled += 1;
                tried = 0;
            } else {
                tried += 1;
            }
        }
        // Every word has its holes: cancel in the fullest words.
        while cancelled < WORD {
            let word = (0..words)
                .max_by_key(|&w| board.live_in_word(w))
                .expect("a word");
            let handle = board.take_in_word(word, &mut rng).expect("a live timer");
            assert!(engine.cancel(handle));
            cancelled += 1;
        }
        // Past the longest a cancel's message waits on a lane (32 ticks), so that the
        // worker frees every cancelled node into the bitmap before the next arms.
        clock.advance(ms(40));
        engine.turn();
        if round % 10 == 0 {
            assert_eq!(
                engine.nodes_in_use(),
                live - WORD,
                "round {round}: every cancelled node freed"
            );
        }
        for _ in 0..WORD {
            board.add(engine.schedule(Duration::from_secs(3600), || {}).unwrap());
        }
        clock.advance(ms(1));
        engine.turn();
        peak = peak.max(pool_nodes(&engine));
    }
    clock.advance(ms(40));
    engine.turn();
    assert_eq!(engine.nodes_in_use(), live);
    engine.shutdown(PendingTimers::Drop);
    assert_eq!(engine.nodes_in_use(), 0);
    peak
}

/// Attacks the growth rule where it decides: 16,384 timers stay live while an adversary
/// cancels and re-arms 64 a round for 300 rounds, placing every cancel so that each word
/// keeps at most 7 free nodes (just under an eighth: no word is ever half free, and the
/// pool's free share stays below the line, so refills grow), 20 (thin words taken), or
/// 31 (just under half). The pool must stay within the rule's bound for its live timers
/// and the one thread's magazine.
#[test]
fn holes_spread_thin_by_an_adversary_keep_the_pool_within_its_eighth() {
    within(LIMIT, "the thin-holes adversary", || {
        const LIVE: usize = 16_384;
        for (holes, seed) in [(7, 1), (20, 2), (31, 3)] {
            let peak = thin_holes(LIVE, holes, 300, seed);
            println!(
                "thin holes ({holes} a word): pool {peak} nodes at most for {LIVE} live ({:.3}x)",
                peak as f64 / LIVE as f64
            );
            assert!(
                peak <= growth_bound(LIVE, MAGAZINE_MAX, 0),
                "{holes} holes a word: the pool grew to {peak} nodes for {LIVE} live timers \
                 (bound {})",
                growth_bound(LIVE, MAGAZINE_MAX, 0)
            );
        }
    });
}

/// A small pool under the same adversary, where the two-chunk rule (`PLENTY_FREE`) and
/// the eighth meet (2,000 live timers: an eighth of the pool is under two chunks).
#[test]
fn holes_spread_thin_in_a_small_pool_keep_it_bounded() {
    within(LIMIT, "the small thin-holes adversary", || {
        const LIVE: usize = 2_000;
        for (holes, seed) in [(7, 4), (31, 5)] {
            let peak = thin_holes(LIVE, holes, 600, seed);
            println!(
                "small pool, thin holes ({holes} a word): pool {peak} nodes at most for {LIVE} \
                 live ({:.3}x)",
                peak as f64 / LIVE as f64
            );
            assert!(
                peak <= growth_bound(LIVE, MAGAZINE_MAX, 0),
                "the pool grew to {peak} nodes for {LIVE} live timers"
            );
        }
    });
}

/// Attacks the rule with a ring of mixed timers on the manual clock: every millisecond 64
/// timers are armed, of which 24 (positions 0-23 of each 64) fire 1-3 ms later and the
/// other 40 live 400 ms and then fire, so every word the ring passes keeps 40 pending
/// nodes and 24 free ones (under half), for 1,500 ms. Each timer must fire exactly once at
/// its exact tick, and the pool must stay within the rule's bound for the peak pending.
#[test]
fn a_ring_of_long_and_short_timers_runs_each_once_in_a_bounded_pool() {
    within(LIMIT, "the mixed ring", || {
        let (engine, clock) = manual_engine(1 << 20);
        let start = clock.now();
        let now_ms = |clock: &ManualClock| clock.now().duration_since(start).as_millis() as u64;
        let runs: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
        let mut due: Vec<u64> = Vec::new();
        let mut pending = 0_usize;
        let (mut peak_pending, mut peak_pool) = (0, 0);
        let mut rng = Rng(77);
        for _ms in 0..1500 {
            for k in 0..WORD {
                let id = due.len();
                let delay = if k < 24 { 1 + rng.below(3) } else { 400 };
                let (runs, c) = (Arc::clone(&runs), clock.clone());
                engine
                    .schedule(ms(delay), move || {
                        let at = c.now().duration_since(start).as_millis() as u64;
                        runs.lock().unwrap().push((id, at));
                    })
                    .expect("room in the pool");
                due.push(now_ms(&clock) + delay);
                pending += 1;
            }
            peak_pending = peak_pending.max(pending);
            clock.advance(ms(1));
            engine.turn();
            for (id, at) in std::mem::take(&mut *runs.lock().unwrap()) {
                assert_eq!(at, due[id], "timer {id} ran at {at}, due {}", due[id]);
                due[id] = u64::MAX;
                pending -= 1;
            }
            peak_pool = peak_pool.max(pool_nodes(&engine));
        }
        for _ in 0..500 {
            clock.advance(ms(1));
            engine.turn();
        }
        for (id, at) in std::mem::take(&mut *runs.lock().unwrap()) {
            assert_eq!(at, due[id], "timer {id} ran at {at}, due {}", due[id]);
            due[id] = u64::MAX;
        }
        assert!(
            due.iter().all(|&d| d == u64::MAX),
            "timers that never ran (or ran twice: the assert above)"
        );
        println!(
            "mixed ring: {} timers, pool {peak_pool} nodes at most for {peak_pending} pending \
             ({:.3}x)",
            due.len(),
            peak_pool as f64 / peak_pending as f64
        );
        assert!(
            peak_pool <= growth_bound(peak_pending, MAGAZINE_MAX, 0),
            "the pool grew to {peak_pool} nodes for {peak_pending} pending"
        );
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

/// Attacks the rule with long timers that shift: one timer in every 8 armed lives 2 s,
/// the rest are cancelled within 1-30 ms, with 8,192 pending at a time, for 2,500 ms
/// of the manual clock, so that the long ones pin one node in eight of every word the
/// ring passes and the cancels come back in the order of a request's answer, not of its
/// arming. Exactly once, at its tick, unless cancelled; the pool within the bound.
#[test]
fn request_timeouts_with_pinned_stragglers_keep_the_pool_bounded() {
    within(LIMIT, "the straggler ring", || {
        let (engine, clock) = manual_engine(1 << 20);
        let start = clock.now();
        let now_ms = |clock: &ManualClock| clock.now().duration_since(start).as_millis() as u64;
        let runs: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
        let mut rng = Rng(99);
        // (handle, due) per id; cancels by the ms they are due to be answered.
        let mut timers: Vec<(TimerHandle, u64)> = Vec::new();
        let mut answers: VecDeque<Vec<usize>> = (0..32).map(|_| Vec::new()).collect();
        let mut done: Vec<bool> = Vec::new();
        let mut pending = 0_usize;
        let (mut peak_pending, mut peak_pool, mut fired, mut cancelled) = (0, 0, 0, 0);
        for _ms in 0..2500 {
            while pending < 8192 {
                let id = timers.len();
                let long = id % 8 == 3;
                let delay = if long { 2000 } else { 50 };
                let (runs, c) = (Arc::clone(&runs), clock.clone());
                let handle = engine
                    .schedule(ms(delay), move || {
                        let at = c.now().duration_since(start).as_millis() as u64;
                        runs.lock().unwrap().push((id, at));
                    })
                    .expect("room in the pool");
                timers.push((handle, now_ms(&clock) + delay));
                done.push(false);
                pending += 1;
                if !long {
                    answers[rng.below(30) as usize].push(id);
                }
            }
            peak_pending = peak_pending.max(pending);
            for id in answers.pop_front().expect("a slot") {
                if !done[id] {
                    assert!(engine.cancel(timers[id].0), "timer {id} was pending");
                    done[id] = true;
                    pending -= 1;
                    cancelled += 1;
                }
            }
            answers.push_back(Vec::new());
            clock.advance(ms(1));
            engine.turn();
            for (id, at) in std::mem::take(&mut *runs.lock().unwrap()) {
                assert!(!done[id], "timer {id} ran after its cancel or twice");
                assert_eq!(at, timers[id].1, "timer {id} ran at {at}");
                done[id] = true;
                pending -= 1;
                fired += 1;
            }
            peak_pool = peak_pool.max(pool_nodes(&engine));
        }
        println!(
            "stragglers: {} timers, {fired} fired, {cancelled} cancelled; pool {peak_pool} \
             nodes at most for {peak_pending} pending ({:.3}x)",
            timers.len(),
            peak_pool as f64 / peak_pending as f64
        );
        assert!(fired > 1000 && cancelled > 10_000);
        assert!(
            peak_pool <= growth_bound(peak_pending, MAGAZINE_MAX, 0),
            "the pool grew to {peak_pool} nodes for {peak_pending} pending"
        );
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    });
}

// ---------------------------------------------------------------------------------------
// The real clock: a ring of request timeouts from several threads.
// ---------------------------------------------------------------------------------------

/// Attacks the rule as a server would use it: four threads on one shard each arm request
/// timeouts of 30 ms, and answer each request 0-40 ms after arming it (a cancel; answers
/// after 30 ms come too late and the timeout fires), keeping 2,000 requests in flight each,
/// for 1.5 s. The pool is compared against the most nodes seen in use (pending timers and
/// cancelled ones on their way back) plus what four magazines and the worker can hold,
/// with a margin of half again for the peaks between samples; every timer runs exactly
/// once, never early, unless its cancel won; nothing is lost.
#[test]
fn a_ring_of_request_timeouts_on_the_real_clock_keeps_the_pool_bounded() {
    within(LIMIT, "the request-timeout ring", || {
        const THREADS: usize = 4;
        const IN_FLIGHT: usize = 2_000;
        let engine = real_engine(1, 1 << 20);
        let outcomes = Outcomes::new(3_000_000);
        let next = Arc::new(AtomicUsize::new(0));
        let live = Live::default();
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                let (engine, outcomes, next, live, stop) = (
                    Arc::clone(&engine),
                    Arc::clone(&outcomes),
                    Arc::clone(&next),
                    live.clone(),
                    Arc::clone(&stop),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng(900 + t);
                    // (id, handle, when answered)
                    let mut flight: VecDeque<(usize, TimerHandle, Instant)> = VecDeque::new();
                    let mut early_answers: Vec<(usize, TimerHandle, Instant)> = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        // Answer what is due (in order of answer time, roughly).
                        let mut k = 0;
                        while k < early_answers.len() {
                            if early_answers[k].2 <= now {
                                let (id, handle, _) = early_answers.swap_remove(k);
                                if engine.cancel(handle) {
                                    outcomes.cancelled[id].fetch_add(1, Ordering::SeqCst);
                                }
                            } else {
                                k += 1;
                            }
                        }
                        while flight.len() + early_answers.len() < IN_FLIGHT {
                            let id = next.fetch_add(1, Ordering::Relaxed);
                            if id >= outcomes.ran.len() {
                                return;
                            }
                            let delay = ms(30);
                            let handle = engine
                                .schedule(delay, outcomes.callback(id, delay, &live))
                                .expect("room in the pool");
                            let answer = Instant::now() + Duration::from_micros(rng.below(40_000));
                            flight.push_back((id, handle, answer));
                        }
                        // Move the oldest into the answering set once a batch is in flight.
                        while flight.len() > 64 {
                            let entry = flight.pop_front().expect("in flight");
                            early_answers.push(entry);
                        }
                        if early_answers.len() >= IN_FLIGHT - 64 {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                    for (id, handle, _) in flight.into_iter().chain(early_answers) {
                        if engine.cancel(handle) {
                            outcomes.cancelled[id].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        let until = Instant::now() + Duration::from_millis(1500);
        let (mut peak_in_use, mut peak_pool) = (0, 0);
        while Instant::now() < until {
            peak_in_use = peak_in_use.max(engine.nodes_in_use());
            peak_pool = peak_pool.max(pool_nodes(&engine));
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        for thread in threads {
            thread.join().expect("a requesting thread");
        }
        peak_pool = peak_pool.max(pool_nodes(&engine));
        let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
        assert!(
            eventually(Duration::from_secs(10), || (0..ids)
                .all(|id| outcomes.settled(id))),
            "timers lost: {} never ran nor were cancelled",
            (0..ids).filter(|&id| !outcomes.settled(id)).count()
        );
        outcomes.check(ids);
        let fired = (0..ids)
            .filter(|&id| outcomes.ran[id].load(Ordering::SeqCst) == 1)
            .count();
        println!(
            "request ring: {ids} requests, {fired} timed out; pool {peak_pool} nodes at most, \
             {peak_in_use} in use at most ({} requests in flight)",
            THREADS * IN_FLIGHT
        );
        assert!(ids > 20_000, "too few requests to mean anything: {ids}");
        let held = THREADS * MAGAZINE_MAX + WORD;
        let bound = growth_bound(peak_in_use + peak_in_use / 2, held, 1);
        assert!(
            peak_pool <= bound,
            "the pool grew to {peak_pool} nodes with at most {peak_in_use} seen in use \
             (bound {bound})"
        );
        support::assert_all_given_back(&engine, &live);
    });
}

// ---------------------------------------------------------------------------------------
// The size limit: the wait for a chunk being carved.
// ---------------------------------------------------------------------------------------

/// Attacks the wait where the pool holds exactly what the racers need: `threads` threads
/// released together on a fresh engine whose pool holds `chunks` chunks each arm timers of
/// an hour until they have taken two words (128 nodes, arming 100 of them), so that the
/// racers take every word of the pool between them and need no more. No node is ever
/// freed, so a refill that reports the pool full while a word is still untaken, or about
/// to be given by a chunk being carved, is a spurious capacity error. Returns the errors.
fn exact_fit_race(threads: usize, chunks: usize, rounds: usize) -> usize {
    let mut full = 0;
    for _ in 0..rounds {
        let engine = real_engine(1, chunks * CHUNK);
        let barrier = Arc::new(Barrier::new(threads));
        let racers: Vec<_> = (0..threads)
            .map(|_| {
                let (engine, barrier) = (Arc::clone(&engine), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut handles = Vec::new();
                    let mut errors = 0;
                    for _ in 0..100 {
                        match engine.schedule(Duration::from_secs(3600), || {}) {
                            Ok(handle) => handles.push(handle),
                            Err(ScheduleError::Capacity) => errors += 1,
                            Err(other) => panic!("{other:?}"),
                        }
                    }
                    (handles, errors)
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for racer in racers {
            let (handles, errors) = racer.join().expect("a racer");
            full += errors;
            for handle in handles {
                assert!(seen.insert(index(handle)), "node {} twice", index(handle));
            }
        }
        assert_eq!(pool_nodes(&engine), chunks * CHUNK);
        engine.shutdown(PendingTimers::Drop);
        assert_eq!(engine.nodes_in_use(), 0);
    }
    full
}

/// 16 threads on one pool of two chunks (32 words, two each), 32 threads on one of four
/// chunks (64 words) and 64 on one of eight (128 words), released together: every first refill races the carving of
/// the chunks, most find the region claimed and must wait for its carve.
#[test]
fn racers_that_need_the_whole_pool_never_find_it_full() {
    let (small, large, many) = within(LIMIT, "the exact-fit race", || {
        (
            exact_fit_race(16, 2, 40),
            exact_fit_race(32, 4, 15),
            exact_fit_race(64, 8, 5),
        )
    });
    println!(
        "exact fit: {small} capacity errors (16 threads, 2 chunks), {large} (32, 4), \
         {many} (64, 8)"
    );
    assert_eq!(
        (small, large, many),
        (0, 0, 0),
        "capacity errors with words untaken"
    );
}

/// Starts `threads` racers at the size limit.
fn start_racers(
    engine: &Arc<TimerEngine>,
    outcomes: &Arc<Outcomes>,
    next: &Arc<AtomicUsize>,
    stop: &Arc<AtomicBool>,
    threads: u64,
    live: &Live,
) -> Vec<std::thread::JoinHandle<(Vec<TimerHandle>, usize)>> {
    (0..threads)
        .map(|t| {
            let (engine, outcomes, next, stop, live) = (
                Arc::clone(engine),
                Arc::clone(outcomes),
                Arc::clone(next),
                Arc::clone(stop),
                live.clone(),
            );
            let shape = ArmShape {
                seed: t,
                most_delay: ms(2),
                shutdown_ok: true,
            };
            std::thread::spawn(move || race_arms(&engine, &outcomes, (&next, &stop), shape, &live))
        })
        .collect()
}

/// Attacks the refill at the size limit with more threads than the pool has words: 24
/// threads arm (0-2 ms) and cancel on a fresh engine whose pool holds one chunk (16
/// words), for 1.5 s, so that refills at the limit, the wait for the carve, the worker's
/// give-backs and the threads' magazines all race. Nothing may hang; no two schedules may
/// return the same handle; each timer runs exactly once, never early, unless cancelled or
/// refused; afterwards every node is back and a fresh thread arms exactly 1,024.
#[test]
fn more_threads_than_words_at_the_size_limit_lose_nothing() {
    within(LIMIT, "the over-subscribed race", || {
        let engine = real_engine(1, CHUNK);
        let outcomes = Outcomes::new(3_000_000);
        let (next, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let live = Live::default();
        let threads = start_racers(&engine, &outcomes, &next, &stop, 24, &live);
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        let (mut handles, mut full, mut armed) = (HashSet::new(), 0, 0);
        for thread in threads {
            let (mine, f) = thread.join().expect("a racer");
            full += f;
            armed += mine.len();
            for handle in mine {
                assert!(handles.insert(handle), "one node, two timers: {handle:?}");
            }
        }
        let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
        println!("24 threads on 16 words: {armed} armed, {full} capacity errors of {ids}");
        assert!(armed > 1000, "armed too little to mean anything: {armed}");
        assert!(
            eventually(Duration::from_secs(10), || (0..ids)
                .all(|id| outcomes.settled(id))),
            "timers lost"
        );
        outcomes.check(ids);
        support::assert_all_given_back(&engine, &live);
        assert_eq!(pool_nodes(&engine), CHUNK);
        assert_eq!(
            arm_until_full(&engine, Duration::from_secs(3600)),
            CHUNK,
            "every node came back"
        );
    });
}

/// Attacks shutdown racing refills at the size limit, and the pool's first carve: 12
/// threads start arming on a fresh engine of one chunk (so the first refills race the
/// carve and wait on it) while the main thread shuts the engine down after 0-9 ms, 30
/// times, with pending timers dropped or run. Nothing may hang; no timer may run twice, or
/// early when dropped; every capture is dropped and every node back.
#[test]
fn shutdown_racing_the_first_carve_and_the_size_limit_loses_nothing() {
    within(LIMIT, "the shutdown race", || {
        let mut rng = Rng(31);
        for round in 0..30 {
            let pending = if round % 2 == 0 {
                PendingTimers::Drop
            } else {
                PendingTimers::Run
            };
            let engine = real_engine(1, CHUNK);
            let outcomes = Outcomes::new(200_000);
            let (next, stop) = (
                Arc::new(AtomicUsize::new(0)),
                Arc::new(AtomicBool::new(false)),
            );
            let live = Live::default();
            let threads = start_racers(&engine, &outcomes, &next, &stop, 12, &live);
            std::thread::sleep(ms(rng.below(10)));
            engine.shutdown(pending);
            std::thread::sleep(ms(5));
            stop.store(true, Ordering::Relaxed);
            let mut handles = HashSet::new();
            for thread in threads {
                for handle in thread.join().expect("a racer").0 {
                    assert!(handles.insert(handle), "one node, two timers: {handle:?}");
                }
            }
            let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
            outcomes.check_after_shutdown(ids, pending);
            support::assert_all_given_back(&engine, &live);
        }
    });
}

/// Attacks dropping the engine while many threads are mid-refill at the size limit: 12
/// threads arm and cancel through a `Weak` on a pool of one chunk; the main thread drops
/// the only strong reference after 0-19 ms (so that the engine shuts down and is dropped
/// on whichever thread lets it go last), 20 times. Nothing may hang or panic, and every
/// capture must be dropped.
#[test]
fn dropping_the_engine_during_refills_at_the_size_limit_drops_every_capture() {
    within(LIMIT, "dropping during refills", || {
        let mut rng = Rng(55);
        for round in 0..20_u64 {
            let live = Live::default();
            let engine = real_engine(1, CHUNK);
            let weak = Arc::downgrade(&engine);
            let stopping = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..12)
                .map(|t| {
                    let (weak, live, stopping) =
                        (weak.clone(), live.clone(), Arc::clone(&stopping));
                    std::thread::spawn(move || {
                        let mut rng = Rng(1000 * round + t);
                        let mut recent = Vec::new();
                        while !stopping.load(Ordering::Relaxed) {
                            let Some(engine) = weak.upgrade() else { break };
                            let witness = live.witness();
                            let delay = Duration::from_micros(rng.below(2_000));
                            match engine.schedule(delay, move || drop(witness)) {
                                Ok(handle) => recent.push(handle),
                                Err(ScheduleError::Capacity | ScheduleError::Shutdown) => {}
                                Err(other) => panic!("{other:?}"),
                            }
                            if rng.percent(40) && !recent.is_empty() {
                                let at = rng.below(recent.len() as u64) as usize;
                                engine.cancel(recent.swap_remove(at));
                            }
                            if recent.len() > 32 {
                                recent.remove(0);
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(ms(rng.below(20)));
            stopping.store(true, Ordering::Relaxed);
            drop(engine);
            for thread in threads {
                thread.join().expect("a racer");
            }
            assert!(
                eventually(Duration::from_secs(10), || weak.strong_count() == 0),
                "the engine was never dropped"
            );
            assert!(
                eventually(Duration::from_secs(5), || live.count() == 0),
                "round {round}: captures left after the engine was dropped: {}",
                live.count()
            );
        }
    });
}

/// Attacks the size limit with threads that come and go: four threads spin arming timers
/// due at once on a pool of one chunk (full nearly all the time), while 100 short-lived
/// threads, four at a time, each arm up to 10 timers of 1-3 ms (capacity errors allowed)
/// and exit, their magazines going back. Nothing may hang or be lost; afterwards every
/// node is back and a fresh thread arms exactly 1,024.
#[test]
fn threads_exiting_beside_spinning_refills_at_the_size_limit_lose_nothing() {
    within(LIMIT, "exiting threads at the limit", || {
        let engine = real_engine(1, CHUNK);
        let outcomes = Outcomes::new(4_000_000);
        let (next, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let live = Live::default();
        let spinners = start_racers(&engine, &outcomes, &next, &stop, 4, &live);
        let mut exited_armed = 0;
        for wave in 0..25_u64 {
            let threads: Vec<_> = (0..4_u64)
                .map(|t| {
                    let (engine, outcomes, next, live) = (
                        Arc::clone(&engine),
                        Arc::clone(&outcomes),
                        Arc::clone(&next),
                        live.clone(),
                    );
                    std::thread::spawn(move || {
                        let mut rng = Rng(5000 + wave * 4 + t);
                        let mut armed = 0;
                        for _ in 0..1 + rng.below(10) {
                            let id = next.fetch_add(1, Ordering::Relaxed);
                            let delay = ms(1 + rng.below(3));
                            match engine.schedule(delay, outcomes.callback(id, delay, &live)) {
                                Ok(_) => armed += 1,
                                Err(ScheduleError::Capacity) => {
                                    outcomes.cancelled[id].store(1, Ordering::SeqCst);
                                }
                                Err(other) => panic!("{other:?}"),
                            }
                        }
                        armed
                    })
                })
                .collect();
            for thread in threads {
                exited_armed += thread.join().expect("an exiting thread");
            }
        }
        stop.store(true, Ordering::Relaxed);
        let mut handles = HashSet::new();
        let mut full = 0;
        for thread in spinners {
            let (mine, f) = thread.join().expect("a spinner");
            full += f;
            for handle in mine {
                assert!(handles.insert(handle), "one node, two timers: {handle:?}");
            }
        }
        let ids = next.load(Ordering::SeqCst).min(outcomes.ran.len());
        println!(
            "exiting threads at the limit: {exited_armed} armed by exiting threads, \
             {} by spinners ({full} capacity errors)",
            handles.len()
        );
        assert!(
            eventually(Duration::from_secs(10), || (0..ids)
                .all(|id| outcomes.settled(id))),
            "timers lost"
        );
        outcomes.check(ids);
        support::assert_all_given_back(&engine, &live);
        assert_eq!(
            arm_until_full(&engine, Duration::from_secs(3600)),
            CHUNK,
            "every node came back"
        );
    });
}

/// Records a limit of the pool that neither change claims to lift, found while attacking
/// the size limit: free nodes held in other threads' magazines are invisible to a refill.
/// On a pool of one chunk (16 words), 17 threads each arm one timer of an hour and stay
/// alive; each took a whole word into its magazine, so the 17th finds the pool full with
/// 16 timers pending and 1,008 nodes free. Asserts what an application would expect.
#[test]
#[ignore = "limit, not a fault of the growth rule: nodes idle in other threads' magazines \
            are invisible to a refill, so a 1-chunk pool reports Capacity with 16 of 1,024 \
            nodes in use"]
fn idle_threads_holding_magazines_make_a_nearly_empty_pool_report_full() {
    let engine = real_engine(1, CHUNK);
    let release = Arc::new(Barrier::new(18));
    let armed = Arc::new(Barrier::new(18));
    let threads: Vec<_> = (0..17)
        .map(|_| {
            let (engine, release, armed) = (
                Arc::clone(&engine),
                Arc::clone(&release),
                Arc::clone(&armed),
            );
            std::thread::spawn(move || {
                let result = engine.schedule(Duration::from_secs(3600), || {});
                armed.wait();
                release.wait();
                result.err()
            })
        })
        .collect();
    armed.wait();
    let in_use = engine.nodes_in_use();
    release.wait();
    let errors: Vec<_> = threads
        .into_iter()
        .filter_map(|t| t.join().expect("a thread"))
        .collect();
    println!("17 threads, one timer each: {in_use} nodes in use, errors {errors:?}");
    assert!(
        errors.is_empty(),
        "{} schedules found the pool full with {in_use} of {CHUNK} nodes in use",
        errors.len()
    );
}
