//! Where a timer is filed in a wheel (a slot, the ready list or the overflow list) and the
//! end-of-list marker: the vocabulary shared by the wheel's lists, its slab nodes and the
//! engine's pooled nodes.

use std::num::NonZeroU16;

/// Marks the end of an intrusive list.
pub(crate) const NIL: u32 = u32::MAX;

/// Which list a node is on, so that cancel can unlink it without searching.
///
/// Non-zero so that `Option<Node<T>>` needs no extra tag: the slab's per-timer overhead is
/// part of the wheel's 64-byte budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location(NonZeroU16);

/// A decoded [`Location`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filed {
    /// Due already, waiting for the next poll.
    Ready,
    /// Beyond the wheel's span.
    Overflow,
    /// In slot `slot` of level `level`.
    Slot { level: usize, slot: usize },
}

const READY: u16 = u16::MAX;
const OVERFLOW: u16 = u16::MAX - 1;
/// Slot codes are `level * 64 + slot + 1`; with at most 64 levels of at most 64 slots they
/// stay far below the two markers.
const SLOT_STRIDE: usize = 64;
const COMPACT_READY: u16 = (1 << 12) - 1;
const COMPACT_OVERFLOW: u16 = (1 << 12) - 2;

impl Location {
    pub(crate) const READY: Self = Self::from_code(READY);
    pub(crate) const OVERFLOW: Self = Self::from_code(OVERFLOW);

    #[inline]
    const fn from_code(code: u16) -> Self {
        match NonZeroU16::new(code) {
            Some(code) => Self(code),
            None => Self(NonZeroU16::MAX),
        }
    }

    #[inline]
    pub(crate) const fn slot(level: usize, slot: usize) -> Self {
        Self::from_code((level * SLOT_STRIDE + slot + 1) as u16)
    }

    /// The location in 12 bits, for a node that packs it beside its links. Only wheels of
    /// at most 63 level arrays (the engine's has 7) fit: their slot codes stay below the
    /// two markers' compact forms.
    #[inline]
    pub(crate) const fn compact(self) -> u16 {
        match self.0.get() {
            READY => COMPACT_READY,
            OVERFLOW => COMPACT_OVERFLOW,
            code => code,
        }
    }

    /// The inverse of [`compact`](Self::compact).
    #[inline]
    pub(crate) const fn from_compact(compact: u16) -> Self {
        match compact {
            COMPACT_READY => Self::READY,
            COMPACT_OVERFLOW => Self::OVERFLOW,
            code => Self::from_code(code),
        }
    }

    #[inline]
    pub(crate) const fn decode(self) -> Filed {
        match self.0.get() {
            READY => Filed::Ready,
            OVERFLOW => Filed::Overflow,
            code => {
                let code = code as usize - 1;
                Filed::Slot {
                    level: code / SLOT_STRIDE,
                    slot: code % SLOT_STRIDE,
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn locations_round_trip() {
        assert_eq!(Location::READY.decode(), Filed::Ready);
        assert_eq!(Location::OVERFLOW.decode(), Filed::Overflow);
        for level in 0..64 {
            for slot in 0..64 {
                assert_eq!(
                    Location::slot(level, slot).decode(),
                    Filed::Slot { level, slot }
                );
            }
        }
    }

    #[test]
    fn compact_locations_round_trip_for_the_engine_geometry() {
        for location in [Location::READY, Location::OVERFLOW] {
            assert_eq!(Location::from_compact(location.compact()), location);
        }
        for level in 0..7 {
            for slot in 0..64 {
                let location = Location::slot(level, slot);
                assert!(location.compact() < 1 << 12);
                assert_eq!(Location::from_compact(location.compact()), location);
            }
        }
    }
}
