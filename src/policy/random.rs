//! Injected randomness. The policy core never reaches for a global RNG: each
//! caller hands in a [`Random`], seeded explicitly, so a schedule is
//! reproducible from its seed.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A source of uniform draws in `[0, 1)`.
pub trait Random {
    fn next_f64(&mut self) -> f64;
}

/// The production and test source: a small fast PRNG from an explicit seed.
#[derive(Debug, Clone)]
pub struct SeededRandom(SmallRng);

impl SeededRandom {
    pub fn new(seed: u64) -> Self {
        SeededRandom(SmallRng::seed_from_u64(seed))
    }
}

impl Random for SeededRandom {
    fn next_f64(&mut self) -> f64 {
        self.0.random::<f64>()
    }
}

/// A fixed draw, for tests that pin a jitter to one end of its range.
#[derive(Debug, Clone, Copy)]
pub struct FixedRandom(pub f64);

impl Random for FixedRandom {
    fn next_f64(&mut self) -> f64 {
        self.0
    }
}
