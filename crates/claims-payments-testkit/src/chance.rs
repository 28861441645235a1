//! Deterministic fault decisions.
//!
//! Every random choice the simulator makes (which message is re-sent, which delivery
//! loses its lock, which bank request fails) is a pure function of the run's seed and
//! of *what* is decided about (a domain, a key, an attempt number), never of the order
//! in which concurrent tasks happen to ask. Two runs with the same seed therefore make
//! the same decisions for the same message and the same attempt, however the workers
//! interleave. (Which attempt a process crash hits is up to the OS scheduler and is not
//! repeatable; that is the part the driver does not control.)

/// SplitMix64 finaliser: a cheap, well-mixed 64-bit permutation.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 64-bit value decided by (seed, domain, key, n).
pub fn bits(seed: u64, domain: &str, key: &[u8], n: u64) -> u64 {
    // FNV-1a over domain and key, separated so ("ab","c") and ("a","bc") differ.
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in domain
        .bytes()
        .chain(std::iter::once(0xFF))
        .chain(key.iter().copied())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(mix(seed ^ h) ^ mix(n))
}

/// A uniform number in [0, 1) decided by (seed, domain, key, n).
pub fn unit(seed: u64, domain: &str, key: &[u8], n: u64) -> f64 {
    (bits(seed, domain, key, n) >> 11) as f64 / (1u64 << 53) as f64
}

/// True with probability `p`.
pub fn hit(p: f64, seed: u64, domain: &str, key: &[u8], n: u64) -> bool {
    p > 0.0 && unit(seed, domain, key, n) < p
}

/// A uniform integer in `0..=max`.
pub fn upto(max: u64, seed: u64, domain: &str, key: &[u8], n: u64) -> u64 {
    if max == 0 {
        0
    } else {
        bits(seed, domain, key, n) % (max + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_inputs_same_decision_and_inputs_matter() {
        assert_eq!(bits(7, "d", b"k", 1), bits(7, "d", b"k", 1));
        assert_ne!(bits(7, "d", b"k", 1), bits(8, "d", b"k", 1));
        assert_ne!(bits(7, "d", b"k", 1), bits(7, "e", b"k", 1));
        assert_ne!(bits(7, "d", b"k", 1), bits(7, "d", b"k", 2));
        assert_ne!(bits(7, "ab", b"c", 1), bits(7, "a", b"bc", 1));
    }

    #[test]
    fn hit_rate_is_close_to_p() {
        let hits = (0..20_000u64)
            .filter(|n| hit(0.1, 42, "rate", b"x", *n))
            .count();
        assert!((1_700..2_300).contains(&hits), "{hits}");
        assert!(!(0..1000u64).any(|n| hit(0.0, 42, "rate", b"x", n)));
        assert!((0..1000u64).all(|n| hit(1.0, 42, "rate", b"x", n)));
        assert!((0..1000u64).all(|n| upto(5, 1, "u", b"", n) <= 5));
    }
}
