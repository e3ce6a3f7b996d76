//! Whether a thread's lane holds its pending timers back from the shard's owner.
//!
//! A lane keeps a pending timer through one more claim, then parks it on an old stack for a
//! horizon, in the hope that the thread cancels it meanwhile: a request timeout cancelled
//! within a few milliseconds is then freed by the thread that armed it and never costs the
//! owner anything. That hope costs a walk of the held timers at each stage, and it is lost
//! on a thread whose timers live longer (a cache's TTLs, requests answered in a second):
//! there every timer is walked three times and forwarded anyway. So each lane watches what
//! its held timers come to, and while too few are caught it forwards pending timers at
//! their first claim, holding back only every [`PROBE_EVERY`]th claim's so that it notices
//! when holding starts to pay again.

/// Held timers' fates in one verdict.
const WINDOW: u32 = 256;

/// Holding pays while at least one held timer in this many is caught: a catch saves the
/// owner a filing, a message and an unlink, several times the cost of the walks.
const PAYS_ONE_IN: u32 = 8;

/// While holding does not pay, one claim in this many holds back anyway, to keep learning.
pub(crate) const PROBE_EVERY: u32 = 16;

/// One lane's record. Only its producer thread touches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldBack {
    held: u32,
    caught: u32,
    pays: bool,
    claims: u32,
}

impl HoldBack {
    /// A new lane holds back until it learns otherwise.
    pub(crate) const START: Self = Self {
        held: 0,
        caught: 0,
        pays: true,
        claims: 0,
    };

    /// Whether the claim starting now holds back the pending timers it finds.
    #[inline]
    pub(crate) fn this_claim(&mut self) -> bool {
        self.claims = self.claims.wrapping_add(1);
        self.pays || self.claims % PROBE_EVERY == 0
    }

    /// Of `held` timers that came back to the producer after being held, `caught` had been
    /// cancelled meanwhile.
    #[inline]
    pub(crate) fn record(&mut self, held: u32, caught: u32) {
        self.held += held;
        self.caught += caught;
        if self.held >= WINDOW {
            self.pays = self.caught * PAYS_ONE_IN >= self.held;
            self.held = 0;
            self.caught = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds_of(record: &mut HoldBack, claims: u32) -> u32 {
        (0..claims).filter(|_| record.this_claim()).count() as u32
    }

    #[test]
    fn holds_while_held_timers_are_caught_and_probes_when_they_are_not() {
        let mut record = HoldBack::START;
        assert_eq!(holds_of(&mut record, 64), 64, "a new lane holds back");
        // One in four caught: it pays.
        record.record(WINDOW, WINDOW / 4);
        assert_eq!(holds_of(&mut record, 64), 64);
        // None caught: forward at once, but probe.
        record.record(WINDOW, 0);
        assert_eq!(holds_of(&mut record, 64 * PROBE_EVERY), 64);
        // Probes catch most again: back to holding.
        record.record(WINDOW / 2, WINDOW / 2);
        assert_eq!(
            holds_of(&mut record, 64),
            64 / PROBE_EVERY,
            "half a window is no verdict"
        );
        record.record(WINDOW / 2, WINDOW / 4);
        assert_eq!(holds_of(&mut record, 64), 64);
    }

    #[test]
    fn the_verdict_turns_at_one_in_eight() {
        let mut record = HoldBack::START;
        record.record(WINDOW, WINDOW / PAYS_ONE_IN);
        assert!(record.pays);
        record.record(WINDOW, WINDOW / PAYS_ONE_IN - 1);
        assert!(!record.pays);
    }
}
