//! A tiny, stateless PRNG: every random number is a hash of (seed, device, tick, stream), so any
//! tick can be computed on its own, in any order, from any thread.

/// One round of splitmix64.
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hash of several words.
pub(crate) fn hash(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6770_756D_6F6E_u64, |acc, p| splitmix64(acc ^ splitmix64(*p)))
}

/// Random numbers for one device at one tick; `stream` tells independent draws apart.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Draw {
    seed: u64,
    device: u64,
    tick: u64,
}

impl Draw {
    pub(crate) fn new(seed: u64, device: usize, tick: u64) -> Self {
        Self { seed, device: device as u64, tick }
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(self, stream: u64) -> f64 {
        (hash(&[self.seed, self.device, self.tick, stream]) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub(crate) fn range(self, stream: u64, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit(stream)
    }

    /// Same draw at another tick.
    #[cfg(test)]
    pub(crate) fn at(self, tick: u64) -> Self {
        Self { tick, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_in_range() {
        let d = Draw::new(7, 3, 100);
        assert_eq!(d.unit(1), Draw::new(7, 3, 100).unit(1));
        assert_ne!(d.unit(1), d.unit(2));
        assert_ne!(d.unit(1), Draw::new(8, 3, 100).unit(1));
        let mean = (0..10_000).map(|t| d.at(t).unit(0)).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        assert!((0..1000).all(|t| (0.0..1.0).contains(&d.at(t).unit(5))));
    }
}
