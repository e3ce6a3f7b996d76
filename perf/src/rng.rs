//! A xorshift64* generator with a fixed seed, so that every run draws the same timers.

/// xorshift64*: a few cycles a draw and statistically good enough for picking delays and
/// connections. The harness needs repeatable inputs, not cryptographic ones.
pub struct XorShift64(u64);

impl XorShift64 {
    /// The seed every workload starts from.
    pub const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

    pub fn new(seed: u64) -> Self {
        // Zero is xorshift's one fixed point: it would draw zeros forever.
        Self(if seed == 0 { Self::SEED } else { seed })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` by multiply-and-shift: no division, and the bias (at most n / 2^64)
    /// is far below anything a timing run could see.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `low..high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low)
    }

    /// Fisher-Yates: a uniformly random permutation.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::XorShift64;

    #[test]
    fn draws_stay_in_range_and_repeat() {
        let mut a = XorShift64::new(XorShift64::SEED);
        let mut b = XorShift64::new(XorShift64::SEED);
        for _ in 0..10_000 {
            let x = a.between(5, 9);
            assert!((5..9).contains(&x));
            assert_eq!(x, b.between(5, 9));
        }
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut items: Vec<u32> = (0..1000).collect();
        XorShift64::new(1).shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(items, sorted);
    }
}
