//! Which ids may be pending on disk, in about 1.2 bytes a task.
//!
//! Far-off tasks are kept only on disk, so an upsert cannot look up where the older
//! version of its id lives. It asks this filter instead: "no" means the id is new and the
//! schedule writes nothing more; "maybe" makes it write a tombstone that voids every older
//! version wherever it is. A false "maybe" costs one tombstone, never a wrong answer.
//! Filters fill up and never forget, so a full layer is followed by one twice its size.

use std::hash::{BuildHasher, Hasher};

/// Bits per expected id; with seven probes this gives about 1% false "maybe".
const BITS_PER_ID: usize = 10;
const PROBES: u64 = 7;
/// The most ids one layer is sized for: [`crate::MAX_EXPECTED_PENDING`]. A layer that
/// fills up at this size is followed by another of the same size rather than a larger one.
const MAX_LAYER_IDS: usize = crate::MAX_EXPECTED_PENDING;

struct Layer {
    bits: Vec<u64>,
    capacity: usize,
    len: usize,
}

impl Layer {
    fn new(capacity: usize) -> Layer {
        // Clamped so that the bit count cannot overflow, whatever the caller asked for;
        // `Options::validate` refuses sizes above the clamp before they get here.
        let capacity = capacity.clamp(1024, MAX_LAYER_IDS);
        let words = capacity.saturating_mul(BITS_PER_ID).div_ceil(64);
        Layer {
            bits: vec![0; words],
            capacity,
            len: 0,
        }
    }

    fn positions(&self, hash: u64) -> impl Iterator<Item = usize> + use<> {
        let bits = (self.bits.len() * 64) as u64;
        let h1 = hash;
        let h2 = hash.rotate_left(32) | 1;
        (0..PROBES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % bits) as usize)
    }

    fn insert(&mut self, hash: u64) {
        for p in self.positions(hash) {
            self.bits[p / 64] |= 1 << (p % 64);
        }
        self.len += 1;
    }

    fn contains(&self, hash: u64) -> bool {
        self.positions(hash)
            .all(|p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }
}

/// A growing Bloom filter over task ids.
pub(crate) struct Bloom {
    layers: Vec<Layer>,
    /// Answers "maybe" to everything: used when the ids on disk could not all be read.
    saturated: bool,
}

impl Bloom {
    /// A filter sized for `expected` ids before it first grows.
    pub(crate) fn new(expected: usize) -> Bloom {
        Bloom {
            layers: vec![Layer::new(expected)],
            saturated: false,
        }
    }

    /// A filter that answers "maybe" to every id.
    pub(crate) fn saturated() -> Bloom {
        Bloom {
            layers: vec![Layer::new(0)],
            saturated: true,
        }
    }

    /// Records that `id` may be pending.
    pub(crate) fn insert(&mut self, id: &[u8]) {
        let hash = hash_id(id);
        let last = self.layers.last().expect("at least one layer");
        if last.len >= last.capacity {
            let capacity = last.capacity.saturating_mul(2);
            self.layers.push(Layer::new(capacity));
        }
        self.layers
            .last_mut()
            .expect("at least one layer")
            .insert(hash);
    }

    /// Whether `id` may be pending; `false` is certain.
    pub(crate) fn may_contain(&self, id: &[u8]) -> bool {
        let hash = hash_id(id);
        self.saturated || self.layers.iter().any(|l| l.contains(hash))
    }
}

/// A hash of an id that is the same in every process, so that nothing about it depends
/// on a random seed.
fn hash_id(id: &[u8]) -> u64 {
    let mut hasher =
        std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default().build_hasher();
    hasher.write(id);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let mut bloom = Bloom::new(1000);
        for i in 0..5000u32 {
            bloom.insert(format!("id-{i}").as_bytes());
        }
        assert!((0..5000u32).all(|i| bloom.may_contain(format!("id-{i}").as_bytes())));
        let false_positives = (0..10_000u32)
            .filter(|i| bloom.may_contain(format!("other-{i}").as_bytes()))
            .count();
        assert!(false_positives < 400, "{false_positives} false positives");
    }
}
