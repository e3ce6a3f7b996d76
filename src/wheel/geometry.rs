//! The shape of a hierarchical wheel: how many slots a level has and how many levels there
//! are, and the arithmetic that files a deadline into a level and slot.

use crate::error::GeometryError;

/// Slot and level counts, checked once so that the wheel's hot path can trust them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// log2 of the slots per level, 1..=6.
    slot_bits: u32,
    levels: u32,
    /// The level of each bit of a tick count: a lookup, because dividing by a slot width
    /// only known at run time costs an insert a hardware divide.
    level_of_bit: [u8; 64],
}

impl Geometry {
    pub(crate) const DEFAULT: Self = Self::from_bits(6, 6);

    const fn from_bits(slot_bits: u32, levels: u32) -> Self {
        let mut level_of_bit = [0; 64];
        let mut bit = 0;
        while bit < 64 {
            level_of_bit[bit] = (bit as u32 / slot_bits) as u8;
            bit += 1;
        }
        Self {
            slot_bits,
            levels,
            level_of_bit,
        }
    }

    pub(crate) fn new(slots_per_level: usize, levels: usize) -> Result<Self, GeometryError> {
        if !(2..=64).contains(&slots_per_level) || !slots_per_level.is_power_of_two() {
            return Err(GeometryError::SlotsPerLevel(slots_per_level));
        }
        let slot_bits = slots_per_level.trailing_zeros();
        let span_bits = levels.checked_mul(slot_bits as usize);
        if levels == 0 || span_bits.is_none_or(|bits| bits > 64) {
            return Err(GeometryError::Levels(levels));
        }
        Ok(Self::from_bits(slot_bits, levels as u32))
    }

    #[inline]
    pub(crate) const fn slots(self) -> usize {
        1 << self.slot_bits
    }

    #[inline]
    pub(crate) const fn levels(self) -> usize {
        self.levels as usize
    }

    #[inline]
    const fn slot_mask(self) -> u64 {
        (1 << self.slot_bits) - 1
    }

    /// Bits of a tick count below level `level`'s slot index.
    #[inline]
    pub(crate) const fn shift(self, level: usize) -> u32 {
        self.slot_bits * level as u32
    }

    /// Bits of tick count the levels cover together; 64 means no deadline overflows.
    #[inline]
    pub(crate) const fn span_bits(self) -> u32 {
        self.slot_bits * self.levels
    }

    /// The level a deadline belongs on, seen from `elapsed`: the highest level whose slot
    /// digit differs between the two. `levels()` or more means beyond the wheel's span.
    #[inline]
    pub(crate) const fn level_for(self, elapsed: u64, deadline: u64) -> usize {
        let differing = (elapsed ^ deadline) | self.slot_mask();
        let highest_bit = 63 - differing.leading_zeros();
        self.level_of_bit[highest_bit as usize] as usize
    }

    /// The slot of `deadline` on level `level`.
    #[inline]
    pub(crate) const fn slot_for(self, deadline: u64, level: usize) -> usize {
        ((deadline >> self.shift(level)) & self.slot_mask()) as usize
    }

    /// The tick at which level `level`'s slot `slot` begins, as seen from `elapsed`: in the
    /// level's current rotation for a slot at or after `elapsed`'s, in the next one for a
    /// slot behind it (which only holds timers a coarser slot was moved into ahead of
    /// time).
    #[inline]
    pub(crate) const fn slot_start(self, elapsed: u64, level: usize, slot: usize) -> u64 {
        let level_bits = self.shift(level) + self.slot_bits;
        if level_bits >= 64 {
            return (slot as u64) << self.shift(level);
        }
        let level_start = elapsed & !((1 << level_bits) - 1);
        let start = level_start + ((slot as u64) << self.shift(level));
        if slot < self.slot_for(elapsed, level) {
            start.saturating_add(1 << level_bits)
        } else {
            start
        }
    }

    /// The first occupied slot at or after the one `elapsed` is in, given a level's
    /// occupancy bitmap: a rotate and a trailing-zero count, so empty slots are never walked.
    #[inline]
    pub(crate) const fn next_occupied(self, elapsed: u64, level: usize, occupied: u64) -> usize {
        let now_slot = self.slot_for(elapsed, level);
        let slots = self.slots() as u32;
        let rotated = if slots == 64 {
            occupied.rotate_right(now_slot as u32)
        } else {
            let all_slots = (1_u64 << slots) - 1;
            ((occupied >> now_slot) | (occupied << (slots - now_slot as u32))) & all_slots
        };
        (now_slot + rotated.trailing_zeros() as usize) & self.slot_mask() as usize
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_shapes() {
        assert_eq!(Geometry::new(0, 6), Err(GeometryError::SlotsPerLevel(0)));
        assert_eq!(Geometry::new(1, 6), Err(GeometryError::SlotsPerLevel(1)));
        assert_eq!(Geometry::new(48, 6), Err(GeometryError::SlotsPerLevel(48)));
        assert_eq!(
            Geometry::new(128, 6),
            Err(GeometryError::SlotsPerLevel(128))
        );
        assert_eq!(Geometry::new(64, 0), Err(GeometryError::Levels(0)));
        assert_eq!(Geometry::new(64, 11), Err(GeometryError::Levels(11)));
        assert!(Geometry::new(2, 64).is_ok());
        assert!(Geometry::new(64, 10).is_ok());
        assert_eq!(Geometry::new(2, 65), Err(GeometryError::Levels(65)));
        // Products that overflow, or wrap to something small, are refused, not truncated.
        assert_eq!(
            Geometry::new(4, 1 << 63),
            Err(GeometryError::Levels(1 << 63))
        );
        let wraps_to_two = 3_074_457_345_618_258_603;
        assert_eq!(
            Geometry::new(64, wraps_to_two),
            Err(GeometryError::Levels(wraps_to_two))
        );
    }

    #[test]
    fn files_by_highest_differing_digit() {
        let g = Geometry::DEFAULT;
        assert_eq!(g.level_for(0, 1), 0);
        assert_eq!(g.level_for(0, 63), 0);
        assert_eq!(g.level_for(0, 64), 1);
        assert_eq!(g.level_for(63, 64), 1);
        assert_eq!(g.level_for(64, 127), 0);
        assert_eq!(g.level_for(0, 1 << 36), 6, "beyond six levels");
        assert_eq!(g.slot_for(64 * 5 + 3, 1), 5);
        assert_eq!(g.slot_start(64 * 64 + 10, 1, 7), 64 * 64 + 7 * 64);
        // A slot behind elapsed's is the next rotation's.
        assert_eq!(g.slot_start(64 * 64 + 63 * 64 + 5, 1, 0), 2 * 64 * 64);
    }

    #[test]
    fn finds_the_next_occupied_slot_with_wrap() {
        let g = Geometry::new(8, 3).unwrap();
        assert_eq!(g.next_occupied(5, 0, 0b1010_0000), 5);
        assert_eq!(g.next_occupied(6, 0, 0b1010_0000), 7);
        assert_eq!(g.next_occupied(6, 0, 0b0000_0010), 1);
        let g = Geometry::DEFAULT;
        assert_eq!(g.next_occupied(63, 0, 1), 0);
        assert_eq!(g.next_occupied(3, 0, 1 << 63), 63);
    }
}
