//! Fencing tokens and a resource that checks them.

use std::fmt;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// A number that strictly increases with every new holder of a key.
///
/// Re-entry by the same owner keeps the token; a take-over after expiry gets a larger one.
/// Pass it with every write to a resource the lock protects and let the resource reject
/// tokens lower than the highest it has seen: a holder paused past its lease (GC pause, VM
/// stall) then cannot corrupt data, which no TTL alone prevents. In SQL:
///
/// ```sql
/// UPDATE invoices SET total = $1, fence = $token WHERE id = $2 AND fence <= $token
/// ```
///
/// Each backend declares in [`Capabilities`](crate::Capabilities) whether its tokens are
/// [strict](crate::FencingGuarantee::Strict) or
/// [clock-assisted](crate::FencingGuarantee::ClockAssisted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A write carried a token lower than one the resource has already accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: the resource has seen {highest}")]
pub struct StaleToken {
    /// The token of the rejected write.
    pub presented: FencingToken,
    /// The highest token accepted so far.
    pub highest: FencingToken,
}

/// A value guarded by fencing tokens: writes with a token lower than the highest seen are
/// rejected; the current holder may write repeatedly with the same token.
///
/// This is the in-process form of the check a real resource (a database row, an object
/// store's conditional put) should make.
///
/// # Examples
///
/// ```
/// use lockcore::{FencedResource, FencingToken};
///
/// let account = FencedResource::new(100);
/// account.write(FencingToken(7), |v| *v += 1)?;
/// account.write(FencingToken(7), |v| *v += 1)?; // same holder again: fine
/// assert!(account.write(FencingToken(6), |v| *v = 0).is_err()); // a paused old holder
/// assert_eq!(account.read(), 102);
/// # Ok::<(), lockcore::StaleToken>(())
/// ```
#[derive(Debug, Default)]
pub struct FencedResource<T> {
    inner: Mutex<(Option<FencingToken>, T)>,
}

impl<T> FencedResource<T> {
    /// A resource holding `value` that has seen no token yet.
    pub fn new(value: T) -> Self {
        FencedResource {
            inner: Mutex::new((None, value)),
        }
    }

    /// Applies `f` if `token` is at least the highest token seen, and records it.
    ///
    /// # Errors
    ///
    /// [`StaleToken`] if a higher token was accepted before; `f` is not called.
    pub fn write<R>(
        &self,
        token: FencingToken,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StaleToken> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (highest, value) = &mut *guard;
        if let Some(h) = *highest {
            if token < h {
                return Err(StaleToken {
                    presented: token,
                    highest: h,
                });
            }
        }
        *highest = Some(token);
        Ok(f(value))
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// A copy of the current value.
    pub fn read(&self) -> T
    where
        T: Clone,
    {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }
}
