//! What the service reads from its surroundings besides the store and the bank: the wall
//! clock, randomness, and which process it is (and, for its caches, the machine's size).
//!
//! Production reads the system ([`Ambient::system`]). The deterministic simulator of the
//! development crate gives each simulated instance a virtual wall clock, a seeded
//! generator and a [`Boot`] of its own ([`Ambient::new`]), so one seed replays one run.
//! Monotonic time and timers are tokio's (`tokio::time::Instant`, `sleep`), which a
//! paused runtime advances virtually: no module reads `std::time::Instant`.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

/// A source of wall-clock time.
pub trait WallClock: Send + Sync + 'static {
    fn now(&self) -> OffsetDateTime;
}

/// A source of random bytes.
pub trait Entropy: Send + Sync + 'static {
    fn fill(&self, bytes: &mut [u8]);
}

/// The shards of a cache under an injected ambient: as on a machine of four CPUs.
const INJECTED_CACHE_SHARDS: usize = 16;

/// The clock, randomness and process identity every part of one process shares.
#[derive(Clone)]
pub struct Ambient {
    /// `None`: the system clock (no dynamic call on the hot path).
    clock: Option<Arc<dyn WallClock>>,
    /// `None`: the operating system's generator.
    entropy: Option<Arc<dyn Entropy>>,
    boot: Boot,
}

impl fmt::Debug for Ambient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ambient")
            .field("system_clock", &self.clock.is_none())
            .field("system_entropy", &self.entropy.is_none())
            .field("boot", &self.boot)
            .finish()
    }
}

impl Ambient {
    /// The system's clock and generator, and this process's boot.
    pub fn system() -> Self {
        Ambient {
            clock: None,
            entropy: None,
            boot: Boot::current(),
        }
    }

    /// Another clock, generator and boot (the simulator's instances).
    pub fn new(clock: Arc<dyn WallClock>, entropy: Arc<dyn Entropy>, boot: Boot) -> Self {
        Ambient {
            clock: Some(clock),
            entropy: Some(entropy),
            boot,
        }
    }

    pub fn now(&self) -> OffsetDateTime {
        match &self.clock {
            None => OffsetDateTime::now_utc(),
            Some(clock) => clock.now(),
        }
    }

    /// [`Self::now`] as a `SystemTime` (HTTP dates).
    pub fn system_time(&self) -> SystemTime {
        match &self.clock {
            None => SystemTime::now(),
            Some(clock) => clock.now().into(),
        }
    }

    /// The process that runs this code.
    pub fn boot(&self) -> Boot {
        self.boot
    }

    /// A new attempt of this process.
    pub fn attempt_id(&self) -> AttemptId {
        AttemptId::of_bytes(self.boot, self.random_bytes())
    }

    /// A uniform integer in `0..=max`.
    pub fn upto(&self, max: u64) -> u64 {
        let bytes: [u8; 8] = self.random_bytes();
        let value = u64::from_le_bytes(bytes);
        match max.checked_add(1) {
            None => value,
            Some(span) => value % span,
        }
    }

    /// The hasher of this process's in-memory caches: randomly seeded on the system, and
    /// drawn from the injected generator otherwise, so that a simulated run hashes alike
    /// on every machine.
    pub fn cache_hasher(&self) -> foldhash::quality::SeedableRandomState {
        match &self.entropy {
            None => foldhash::quality::SeedableRandomState::random(),
            Some(_) => foldhash::quality::SeedableRandomState::with_seed(
                self.upto(u64::MAX),
                foldhash::SharedSeed::global_fixed(),
            ),
        }
    }

    /// How many shards a concurrent cache of this process has: `None` on the system (the
    /// cache's own choice, from the machine's CPU count); fixed for an injected ambient,
    /// whose run must not depend on the machine that runs it.
    pub fn cache_shards(&self) -> Option<usize> {
        self.entropy.as_ref().map(|_| INJECTED_CACHE_SHARDS)
    }

    fn random_bytes<const N: usize>(&self) -> [u8; N] {
        let mut bytes = [0; N];
        match &self.entropy {
            None => bytes.copy_from_slice(&Uuid::new_v4().as_bytes()[..N.min(16)]),
            Some(entropy) => entropy.fill(&mut bytes),
        }
        bytes
    }
}

/// Identifies one processing attempt (one invocation). Written into the inbox record
/// it creates or takes over, so the attempt can recognise its own committed write
/// when the SDK re-sends a batch after an ambiguous timeout.
///
/// It also names the process that runs the attempt: a UUID of version 8 whose first six
/// bytes are the process's [`Boot`] and the rest random. A waiter that meets a live lease
/// can then ask whether the process behind it is still alive (`lease::liveness`)
/// instead of waiting the lease out. Owners written by older builds (version 4) name no
/// boot; only their lease decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptId(pub Uuid);

impl AttemptId {
    /// A new attempt of this process, from the system's generator (operator commands
    /// and tests; the service draws its attempts from its [`Ambient`]).
    pub fn new() -> Self {
        Self::of(Boot::current())
    }

    /// A new attempt of the process `boot` (tests play other processes with it).
    pub fn of(boot: Boot) -> Self {
        let mut random = [0; 16];
        random.copy_from_slice(Uuid::new_v4().as_bytes());
        Self::of_bytes(boot, random)
    }

    fn of_bytes(boot: Boot, mut bytes: [u8; 16]) -> Self {
        bytes[..BOOT_BYTES].copy_from_slice(&boot.0);
        AttemptId(Uuid::new_v8(bytes))
    }

    /// The process that runs this attempt; `None` for an owner that names none.
    pub fn boot(&self) -> Option<Boot> {
        if self.0.get_version_num() != 8 {
            return None;
        }
        let mut boot = [0; BOOT_BYTES];
        boot.copy_from_slice(&self.0.as_bytes()[..BOOT_BYTES]);
        Some(Boot(boot))
    }
}

impl Default for AttemptId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

const BOOT_BYTES: usize = 6;

/// One start of a process: 48 random bits drawn when the process first asks for them,
/// the same for every attempt it runs. Displayed as 12 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Boot([u8; BOOT_BYTES]);

impl Boot {
    /// This process's boot.
    pub fn current() -> Boot {
        static CURRENT: std::sync::OnceLock<Boot> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(Boot::random)
    }

    /// Another, random boot (tests play other processes with it).
    pub fn random() -> Boot {
        let mut boot = [0; BOOT_BYTES];
        boot.copy_from_slice(&Uuid::new_v4().as_bytes()[..BOOT_BYTES]);
        Boot(boot)
    }

    /// The boot whose 48 bits are the low bits of `n` (the simulator numbers its
    /// process starts).
    pub fn numbered(n: u64) -> Boot {
        let mut boot = [0; BOOT_BYTES];
        boot.copy_from_slice(&n.to_be_bytes()[8 - BOOT_BYTES..]);
        Boot(boot)
    }

    /// Reads the 12 hex digits [`fmt::Display`] writes.
    pub fn parse(s: &str) -> Option<Boot> {
        if s.len() != 2 * BOOT_BYTES || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut boot = [0; BOOT_BYTES];
        for (i, byte) in boot.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Boot(boot))
    }

    /// A UUID that names this boot alone (the key of its registration).
    pub fn as_uuid(&self) -> Uuid {
        let mut bytes = [0; 16];
        bytes[..BOOT_BYTES].copy_from_slice(&self.0);
        Uuid::new_v8(bytes)
    }
}

impl fmt::Display for Boot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    struct Fixed(OffsetDateTime);
    impl WallClock for Fixed {
        fn now(&self) -> OffsetDateTime {
            self.0
        }
    }
    struct Counting(AtomicU8);
    impl Entropy for Counting {
        fn fill(&self, bytes: &mut [u8]) {
            for b in bytes {
                *b = self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    #[test]
    fn an_injected_clock_and_generator_decide_time_attempts_and_jitter() {
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let make = || {
            Ambient::new(
                Arc::new(Fixed(at)),
                Arc::new(Counting(AtomicU8::new(0))),
                Boot::numbered(7),
            )
        };
        let (a, b) = (make(), make());
        assert_eq!(a.now(), at);
        assert_eq!(SystemTime::from(at), a.system_time());
        // The same generator in the same state draws the same attempt and jitter.
        let (first, again) = (a.attempt_id(), b.attempt_id());
        assert_eq!(first, again);
        assert_eq!(first.boot(), Some(Boot::numbered(7)));
        assert_ne!(a.attempt_id(), first, "each draw moves the generator on");
        let (x, y) = (make(), make());
        assert_eq!(x.upto(9), y.upto(9));
        assert!(x.upto(9) <= 9);
        assert_eq!(Boot::numbered(7).to_string(), "000000000007");
    }

    #[test]
    fn the_system_ambient_is_this_process() {
        let system = Ambient::system();
        assert_eq!(system.boot(), Boot::current());
        assert_ne!(system.attempt_id(), system.attempt_id());
        assert_eq!(system.attempt_id().boot(), Some(Boot::current()));
    }
}
