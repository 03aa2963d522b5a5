//! The one deterministic generator of the simulators and synthetic workloads.
//!
//! SplitMix64: small, fast and good enough for shuffling, tie-breaking and
//! drawing workloads. Every simulator takes its seed as an input, so a run is
//! reproducible from its command line.

use tessera_sched::gpu::RandomSource;

/// SplitMix64 (Steele, Lea and Flood, 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift, unbiased enough for n < 2^32).
    pub fn below_usize(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// `next_u64() % n`: slightly biased for large `n`, kept because recorded
    /// workloads and benchmark figures were drawn this way. Panics if `n == 0`.
    pub fn modulo(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi` (by [`Self::modulo`]); `hi < lo` gives `lo`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.modulo(hi.saturating_sub(lo) + 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl RandomSource for SplitMix64 {
    fn below(&mut self, n: u32) -> u32 {
        self.below_usize(n as usize) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // First outputs of the reference C implementation seeded with 1234567.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        assert_eq!(r.next_u64(), 9817491932198370423);
    }

    #[test]
    fn between_stays_in_range_and_tolerates_reversed_bounds() {
        let mut r = SplitMix64::new(7);
        for _ in 0..1000 {
            let v = r.between(3, 9);
            assert!((3..=9).contains(&v));
            assert!(r.unit() < 1.0);
        }
        assert_eq!(r.between(5, 2), 5);
    }
}
