//! A [`Wheel`] under test beside a model of what it must hold (pending timers by deadline),
//! checked at every step: no timer fires early, twice or after its cancel, none is left
//! overdue after a drain, and `next_deadline` is never past the earliest pending deadline.
//! Shared by the tests of the wheel's due path, its pacing and its boundaries.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use corewheel::{TimerKey, Wheel};

use super::Rng;

/// A wheel and the model of what it must hold, checked after every step.
pub struct Harness {
    pub wheel: Wheel<u64>,
    pub origin: Instant,
    pub tick_ns: u128,
    pub slots: u64,
    pub levels: u32,
    /// The latest instant polled: the wheel's idea of the time.
    pub polled: Option<Instant>,
    pub pending: HashMap<u64, Instant>,
    pub by_deadline: BTreeSet<(Instant, u64)>,
    pub keys: Vec<(TimerKey, u64)>,
    pub next_id: u64,
    pub polls: u64,
    pub idle_polls: u64,
    pub fired: u64,
    /// The most list operations one `poll_expired` call did, less the one for the timer
    /// it handed out, and the tick it was at.
    pub max_poll_work: (u64, u64),
}

impl Harness {
    pub fn new(wheel: Wheel<u64>, slots: u64, levels: u32) -> Self {
        Self {
            origin: wheel.origin(),
            tick_ns: wheel.tick().as_nanos(),
            wheel,
            slots,
            levels,
            polled: None,
            pending: HashMap::new(),
            by_deadline: BTreeSet::new(),
            keys: Vec::new(),
            next_id: 0,
            polls: 0,
            idle_polls: 0,
            max_poll_work: (0, 0),
            fired: 0,
        }
    }

    pub fn default_geometry() -> Self {
        Self::new(Wheel::new(Duration::from_millis(1), Instant::now()), 64, 6)
    }

    pub fn with_geometry(slots: usize, levels: usize, tick: Duration) -> Self {
        let wheel = Wheel::builder()
            .tick(tick)
            .slots_per_level(slots)
            .levels(levels)
            .build(Instant::now())
            .expect("valid geometry");
        Self::new(wheel, slots as u64, levels as u32)
    }

    /// Ticks in one slot of `level`; saturates for levels past the span.
    pub fn width(&self, level: u32) -> u64 {
        self.slots.checked_pow(level).unwrap_or(u64::MAX)
    }

    /// The instant tick `t` begins at (tick 1 begins at the origin).
    pub fn at(&self, t: u64) -> Instant {
        let ns = u128::from(t.saturating_sub(1)) * self.tick_ns;
        let d = Duration::new((ns / 1_000_000_000) as u64, (ns % 1_000_000_000) as u32);
        self.origin + d
    }

    pub fn ns_since(&self, at: Instant) -> u128 {
        at.saturating_duration_since(self.origin).as_nanos()
    }

    /// The tick a deadline rounds up to.
    pub fn ceil_tick(&self, deadline: Instant) -> u64 {
        let t = self.ns_since(deadline).div_ceil(self.tick_ns) + 1;
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// The tick an instant falls in.
    pub fn floor_tick(&self, now: Instant) -> u64 {
        if now < self.origin {
            return 0;
        }
        let t = self.ns_since(now) / self.tick_ns + 1;
        u64::try_from(t).unwrap_or(u64::MAX).min(u64::MAX - 1)
    }

    pub fn now_tick(&self) -> u64 {
        self.polled.map_or(1, |p| self.floor_tick(p))
    }

    pub fn insert(&mut self, deadline: Instant) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        let key = self.wheel.insert(deadline, id);
        self.keys.push((key, id));
        self.pending.insert(id, deadline);
        self.by_deadline.insert((deadline, id));
        self.keys.len() - 1
    }

    pub fn insert_tick(&mut self, t: u64) -> usize {
        let at = self.at(t);
        self.insert(at)
    }

    pub fn cancel(&mut self, pick: usize) {
        if self.keys.is_empty() {
            return;
        }
        let (key, id) = self.keys[pick % self.keys.len()];
        let was = self.pending.remove(&id);
        if let Some(d) = was {
            self.by_deadline.remove(&(d, id));
        }
        assert_eq!(self.wheel.cancel(key), was.map(|_| id), "cancel of {id}");
    }

    pub fn reset(&mut self, pick: usize, deadline: Instant) {
        if self.keys.is_empty() {
            return;
        }
        let (key, id) = self.keys[pick % self.keys.len()];
        let was = self.pending.get(&id).copied();
        assert_eq!(self.wheel.reset(key, deadline), was.is_some(), "reset {id}");
        if let Some(old) = was {
            self.by_deadline.remove(&(old, id));
            self.by_deadline.insert((deadline, id));
            self.pending.insert(id, deadline);
        }
    }

    /// One poll; checks what came out. Returns whether a timer came out.
    pub fn poll_once(&mut self, at: Instant) -> bool {
        let effective = self.polled.map_or(at, |p| p.max(at));
        self.polled = Some(effective);
        self.polls += 1;
        let before = self.wheel.link_operations();
        let out = self.wheel.poll_expired(at);
        let work = self.wheel.link_operations() - before - u64::from(out.is_some());
        if work > self.max_poll_work.0 {
            self.max_poll_work = (work, self.floor_tick(effective));
        }
        let Some(id) = out else {
            return false;
        };
        let deadline = self
            .pending
            .remove(&id)
            .unwrap_or_else(|| panic!("timer {id} fired twice or after its cancel"));
        self.by_deadline.remove(&(deadline, id));
        assert!(
            deadline <= effective,
            "timer {id} fired early: deadline tick {}, polled tick {}",
            self.ceil_tick(deadline),
            self.floor_tick(effective)
        );
        self.fired += 1;
        true
    }

    /// Polls at `at` until nothing is due; checks nothing due was left and the next
    /// deadline lies ahead. Returns how many came out.
    pub fn drain(&mut self, at: Instant) -> u64 {
        let mut out = 0;
        while self.poll_once(at) {
            out += 1;
            assert!(out < 50_000_000, "a drain that never ends");
        }
        if out == 0 {
            self.idle_polls += 1;
        }
        let effective = self.polled.unwrap();
        let now_tick = self.floor_tick(effective);
        if let Some(&(d, id)) = self.by_deadline.first() {
            assert!(
                self.ceil_tick(d) > now_tick,
                "timer {id} (tick {}) is due at tick {now_tick} and was left behind",
                self.ceil_tick(d)
            );
        }
        if let Some(next) = self.wheel.next_deadline() {
            assert!(
                next > effective,
                "next_deadline (tick {}) is not ahead of the drained poll (tick {now_tick})",
                self.floor_tick(next)
            );
        }
        self.check_next_deadline();
        out
    }

    /// `next_deadline` is never later than the earliest pending deadline rounded up to
    /// the tick (or the last poll, for a timer already due), and is `None` only when the
    /// wheel is empty.
    pub fn check_next_deadline(&self) {
        assert_eq!(self.wheel.len(), self.pending.len(), "len");
        let Some(&(d, id)) = self.by_deadline.first() else {
            assert_eq!(self.wheel.next_deadline(), None, "an empty wheel's next");
            return;
        };
        let rounded = self.at(self.ceil_tick(d));
        let bound = self.polled.map_or(rounded, |p| rounded.max(p));
        let next = self
            .wheel
            .next_deadline()
            .unwrap_or_else(|| panic!("next_deadline None with timer {id} pending"));
        assert!(
            next <= bound,
            "next_deadline at tick {} is later than timer {id}'s tick {} (now tick {})",
            self.floor_tick(next),
            self.ceil_tick(d),
            self.now_tick()
        );
    }

    /// Polls only where `next_deadline` says, at most `steps` times or until `until`.
    pub fn follow_next_deadline(&mut self, steps: u64, until: Option<Instant>) {
        for _ in 0..steps {
            let Some(next) = self.wheel.next_deadline() else {
                return;
            };
            if until.is_some_and(|u| next > u) {
                return;
            }
            self.drain(next);
        }
    }

    /// Advances tick by tick, draining at each.
    pub fn step_ticks(&mut self, n: u64) {
        let t = self.now_tick();
        for i in 1..=n {
            let at = self.at(t + i);
            self.drain(at);
        }
    }

    /// Crosses from the last poll to tick `to` the way `rng` chooses: tick by tick, only
    /// where `next_deadline` asks, at a few random points on the way, or in one jump; and
    /// sometimes polls back in time after (a reading older than the last, which the wheel
    /// treats as the last).
    pub fn advance_randomly(&mut self, rng: &mut Rng, to: u64) {
        let now = self.now_tick();
        if to <= now {
            let at = self.at(to.max(1));
            self.drain(at);
            return;
        }
        match rng.below(4) {
            0 if to - now <= 300 => self.step_ticks(to - now),
            1 => {
                let until = self.at(to);
                self.follow_next_deadline(100_000, Some(until));
                self.drain(until);
            }
            2 => {
                let mut t = now;
                while t < to {
                    t = rng.range(t + 1, to + 1);
                    let at = self.at(t);
                    self.drain(at);
                }
            }
            _ => {
                let at = self.at(to);
                self.drain(at);
            }
        }
        if rng.percent(10) {
            let back = self.at(self.now_tick().saturating_sub(rng.range(1, 50)).max(1));
            self.drain(back);
        }
    }

    /// Everything left fires in the end, exactly once, following `next_deadline`.
    pub fn finish(&mut self) {
        let mut guard = 0;
        while let Some(next) = self.wheel.next_deadline() {
            self.drain(next);
            guard += 1;
            assert!(guard < 5_000_000, "finishing never ends");
        }
        assert!(
            self.pending.is_empty(),
            "lost timers: {} left, e.g. {:?}",
            self.pending.len(),
            self.by_deadline.first()
        );
        assert!(self.wheel.is_empty());
        if std::env::var_os("WHEEL_TRACE").is_some() {
            eprintln!(
                "finish: {} fired, {} polls, {} idle, {} link ops",
                self.fired,
                self.polls,
                self.idle_polls,
                self.wheel.link_operations()
            );
        }
    }

    /// One busy tick as an engine's owner polls it: a drain (handing out what is due),
    /// then `extra` more polls at the same instant. Returns the list operations of the
    /// whole tick less one per timer handed out, and how many were handed out.
    pub fn busy_tick(&mut self, t: u64, extra: usize) -> (u64, u64) {
        let now = self.at(t);
        let before = self.wheel.link_operations();
        let out = self.drain(now);
        for _ in 0..extra {
            assert!(
                !self.poll_once(now),
                "a poll after the drain handed out a timer"
            );
        }
        self.check_next_deadline();
        (self.wheel.link_operations() - before - out, out)
    }
}
