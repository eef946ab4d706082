//! Shared claims: what a hold takes of a key — all of it (an exclusive lock, a read-write
//! lock's writer), one share (a reader), or some permits of a semaphore.
//!
//! One rule serves all three: a key holds a set of leases and a capacity; a claim of weight
//! `w` is granted when the live leases' weights plus `w` (plus a waiting heavier claim's
//! reservation, see [`Claim::fits`]) fit the capacity.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::{LockError, LockKey};

/// The capacity of a read-write key (and of every exclusive lock): a reader takes 1 of it,
/// a writer all of it. Stores keep weights and capacities as 64-bit integers (or Lua
/// numbers, exact up to 2^53), so sums of readers never overflow.
pub const READ_WRITE_CAPACITY: u64 = u32::MAX as u64;

/// How a hold uses its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ClaimMode {
    /// The whole key: [`LockClient::lock`](crate::LockClient::lock), and the writer of a
    /// read-write lock.
    Exclusive,
    /// A read lock: shares the key with other readers, excludes a writer.
    Shared,
    /// Some permits of a counting semaphore.
    Permits,
}

impl fmt::Display for ClaimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimMode::Exclusive => "exclusive",
            ClaimMode::Shared => "shared",
            ClaimMode::Permits => "permits",
        })
    }
}

/// What one hold takes of a key: a weight against the capacity stored with the key.
///
/// | claim | weight | capacity |
/// |---|---|---|
/// | [`exclusive`](Self::exclusive) (a lock, a writer) | [`READ_WRITE_CAPACITY`] | [`READ_WRITE_CAPACITY`] |
/// | [`shared`](Self::shared) (a reader) | 1 | [`READ_WRITE_CAPACITY`] |
/// | [`permits(k, n)`](Self::permits) (a semaphore of `n`) | `k` | `n` |
///
/// A backend stores the capacity with the key while any lease or reservation lives, and
/// refuses a claim with a different capacity ([`LockError::capacity_mismatch`]): a
/// semaphore of 4 never redefines a semaphore of 8, nor an exclusive lock.
///
/// # Examples
///
/// ```
/// use distlock_core::{Claim, ClaimMode};
///
/// let writer = Claim::exclusive();
/// let reader = Claim::shared();
/// assert_eq!(writer.capacity(), reader.capacity()); // one read-write key
/// assert!(reader.fits(3, 0)); // readers share
/// assert!(!writer.fits(1, 0)); // a writer waits for every reader
///
/// let two = Claim::permits(2, 3).unwrap();
/// assert_eq!(two.mode(), ClaimMode::Permits);
/// assert!(two.fits(1, 0) && !two.fits(2, 0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    weight: u64,
    capacity: u64,
}

impl Claim {
    /// The whole key: an exclusive lock, or a read-write lock's writer.
    pub const fn exclusive() -> Self {
        Claim {
            weight: READ_WRITE_CAPACITY,
            capacity: READ_WRITE_CAPACITY,
        }
    }

    /// One reader's share of a read-write key.
    pub const fn shared() -> Self {
        Claim {
            weight: 1,
            capacity: READ_WRITE_CAPACITY,
        }
    }

    /// `permits` of a semaphore of `capacity`.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] unless `1 ≤ permits ≤ capacity < u32::MAX`.
    pub fn permits(permits: u32, capacity: u32) -> Result<Self, LockError> {
        if capacity == 0 || u64::from(capacity) >= READ_WRITE_CAPACITY {
            return Err(LockError::config(format!(
                "a semaphore needs between 1 and {} permits, not {capacity}",
                READ_WRITE_CAPACITY - 1
            )));
        }
        if permits == 0 || permits > capacity {
            return Err(LockError::config(format!(
                "a claim takes between 1 and {capacity} permits of this semaphore, not {permits}"
            )));
        }
        Ok(Claim {
            weight: u64::from(permits),
            capacity: u64::from(capacity),
        })
    }

    /// A claim as a store keeps it, `None` for a combination no constructor makes.
    pub fn from_parts(weight: u64, capacity: u64) -> Option<Self> {
        let claim = Claim { weight, capacity };
        let valid = if capacity == READ_WRITE_CAPACITY {
            weight == 1 || weight == READ_WRITE_CAPACITY
        } else {
            capacity > 0 && capacity < READ_WRITE_CAPACITY && weight > 0 && weight <= capacity
        };
        valid.then_some(claim)
    }

    /// What this claim takes of the capacity.
    pub const fn weight(&self) -> u64 {
        self.weight
    }

    /// The capacity of the key it claims.
    pub const fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Exclusive, shared or permits.
    pub const fn mode(&self) -> ClaimMode {
        if self.capacity != READ_WRITE_CAPACITY {
            ClaimMode::Permits
        } else if self.weight == READ_WRITE_CAPACITY {
            ClaimMode::Exclusive
        } else {
            ClaimMode::Shared
        }
    }

    /// Whether this is the whole key (an exclusive lock or a writer).
    pub const fn is_exclusive(&self) -> bool {
        self.weight == READ_WRITE_CAPACITY && self.capacity == READ_WRITE_CAPACITY
    }

    /// The semaphore's permits this claim takes (`None` unless [`ClaimMode::Permits`]).
    pub fn semaphore_permits(&self) -> Option<u32> {
        (self.mode() == ClaimMode::Permits)
            .then(|| u32::try_from(self.weight).ok())
            .flatten()
    }

    /// Whether the claim is granted when the other owners' live leases weigh `used` and
    /// another owner's live reservation weighs `reserved` (0 when none, or when the
    /// reservation is this owner's): `used + weight + reserved ≤ capacity`.
    ///
    /// The reservation is how a heavy claim is not starved: a claim the store refuses
    /// records one for its owner (weight, expiring after the claim's TTL) unless another
    /// owner's reservation lives; later claims of other owners must leave room for it; its
    /// owner's own claim ignores it and clears it when granted; `abandon` removes it. A
    /// refused exclusive claim on a key held by an exclusive lease records none (two
    /// exclusive locks need no reservation: the exclusive path stays as it is).
    pub const fn fits(&self, used: u64, reserved: u64) -> bool {
        // Saturating: 64-bit sums of u32 weights never come close, but a corrupt store
        // value must not wrap round to "fits".
        used.saturating_add(self.weight).saturating_add(reserved) <= self.capacity
    }

    /// Whether `other` (a claim on the same key) agrees on the key's capacity.
    pub const fn same_capacity(&self, other: &Claim) -> bool {
        self.capacity == other.capacity
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode() {
            ClaimMode::Exclusive => f.write_str("an exclusive lock"),
            ClaimMode::Shared => f.write_str("a shared (read) lock"),
            ClaimMode::Permits => write!(
                f,
                "{} of a semaphore of {} permits",
                self.weight, self.capacity
            ),
        }
    }
}

/// What a key is, by its capacity: "an exclusive or read-write lock" or "a semaphore of N".
pub fn describe_capacity(capacity: u64) -> String {
    if capacity == READ_WRITE_CAPACITY {
        "an exclusive or read-write lock".to_owned()
    } else {
        format!("a semaphore of {capacity} permits")
    }
}

impl Serialize for Claim {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Shown {
            mode: ClaimMode,
            #[serde(skip_serializing_if = "Option::is_none")]
            permits: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            capacity: Option<u64>,
        }
        let semaphore = self.mode() == ClaimMode::Permits;
        Shown {
            mode: self.mode(),
            permits: semaphore.then_some(self.weight),
            capacity: semaphore.then_some(self.capacity),
        }
        .serialize(s)
    }
}

impl LockError {
    /// The [`Config`](LockError::Config) error for a claim whose capacity differs from the
    /// one stored with the key; every backend words it the same way.
    pub fn capacity_mismatch(key: &LockKey, stored_capacity: u64, asked: &Claim) -> Self {
        LockError::config(format!(
            "{:?} is held as {}; this request asked for {asked}: a claim never redefines a key (use another key, or the same kind and size)",
            key.as_str(),
            describe_capacity(stored_capacity)
        ))
    }

    /// The [`Config`](LockError::Config) error of a backend without shared claims.
    pub fn claims_unsupported(backend: &str, asked: &Claim) -> Self {
        let what = match asked.mode() {
            ClaimMode::Permits => "semaphores",
            _ => "shared (read-write) locks",
        };
        LockError::config(format!(
            "the {backend} backend, as configured, does not support {what}; asked for {asked}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_weights_and_fit() {
        assert_eq!(Claim::exclusive().mode(), ClaimMode::Exclusive);
        assert_eq!(Claim::shared().mode(), ClaimMode::Shared);
        assert!(Claim::exclusive().fits(0, 0));
        assert!(!Claim::exclusive().fits(1, 0));
        assert!(!Claim::shared().fits(READ_WRITE_CAPACITY, 0));
        assert!(!Claim::shared().fits(0, READ_WRITE_CAPACITY));
        assert!(Claim::shared().fits(1000, 1));
        let p = Claim::permits(3, 4).unwrap();
        assert!(p.fits(1, 0) && !p.fits(2, 0) && !p.fits(0, 2));
        assert_eq!(p.semaphore_permits(), Some(3));
        assert_eq!(Claim::shared().semaphore_permits(), None);
    }

    #[test]
    fn bad_semaphores_are_config_errors() {
        for (k, n) in [(0, 1), (2, 1), (1, 0), (1, u32::MAX)] {
            assert!(matches!(
                Claim::permits(k, n),
                Err(LockError::Config { .. })
            ));
        }
        assert!(Claim::permits(u32::MAX - 1, u32::MAX - 1).is_ok());
    }

    #[test]
    fn parts_round_trip_and_reject_nonsense() {
        for c in [
            Claim::exclusive(),
            Claim::shared(),
            Claim::permits(2, 5).unwrap(),
        ] {
            assert_eq!(Claim::from_parts(c.weight(), c.capacity()), Some(c));
        }
        assert_eq!(Claim::from_parts(2, READ_WRITE_CAPACITY), None);
        assert_eq!(Claim::from_parts(6, 5), None);
        assert_eq!(Claim::from_parts(0, 5), None);
    }

    #[test]
    fn mismatch_names_both() {
        let key = LockKey::new("k").unwrap();
        let text =
            LockError::capacity_mismatch(&key, 8, &Claim::permits(1, 4).unwrap()).to_string();
        assert!(
            text.contains("semaphore of 8") && text.contains("semaphore of 4"),
            "{text}"
        );
        let text =
            LockError::capacity_mismatch(&key, READ_WRITE_CAPACITY, &Claim::permits(1, 4).unwrap())
                .to_string();
        assert!(text.contains("exclusive or read-write"), "{text}");
    }

    #[test]
    fn serialises_mode_and_permits() {
        let json = serde_json::to_string(&Claim::permits(2, 5).unwrap()).unwrap();
        assert_eq!(json, r#"{"mode":"permits","permits":2,"capacity":5}"#);
        let json = serde_json::to_string(&Claim::shared()).unwrap();
        assert_eq!(json, r#"{"mode":"shared"}"#);
    }
}
