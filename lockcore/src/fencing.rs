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

    /// The token as a signed 64-bit integer, for a `BIGINT` column (PostgreSQL has no
    /// unsigned integers; sqlx binds `i64`): `None` above `i64::MAX`.
    ///
    /// No in-tree backend hands out such a token: every store keeps its tokens in a signed
    /// 64-bit integer (a microsecond clock reading near 1.8 × 10¹⁵ on Redis and SQL, a
    /// revision on etcd). A larger token from another backend is refused rather than
    /// clamped: two tokens clamped to the same value would let a stale holder's write pass
    /// a `fence <= $token` check.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_core::FencingToken;
    ///
    /// assert_eq!(FencingToken(1_732_000_000_000_000).as_i64(), Some(1_732_000_000_000_000));
    /// assert_eq!(FencingToken(u64::MAX).as_i64(), None);
    /// ```
    pub fn as_i64(self) -> Option<i64> {
        i64::try_from(self.0).ok()
    }

    /// Checks the outcome of a fenced write made with this token: `rows_affected` is what
    /// the store reported for a statement that changes its row only if the row's fence is
    /// at most this token, such as
    ///
    /// ```sql
    /// UPDATE invoices SET total = $2, fence = $1 WHERE id = $3 AND fence <= $1
    /// ```
    ///
    /// `0` means a later holder has written with a higher token: the write was refused,
    /// and this holder must stop. The statement must match its row whatever the fence (the
    /// row exists, or the statement is an upsert), so that `0` can mean nothing else.
    /// Works with any client that reports affected rows (sqlx's `rows_affected()`,
    /// `tokio-postgres`' `execute`, …); see `docs/fencing.md`.
    ///
    /// # Errors
    ///
    /// [`StaleToken`] (with [`highest`](StaleToken::highest) unknown) when no row was
    /// changed.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_core::FencingToken;
    ///
    /// let token = FencingToken(42);
    /// assert_eq!(token.check_write(1), Ok(1));
    /// let stale = token.check_write(0).unwrap_err();
    /// assert_eq!(stale.presented, token);
    /// ```
    pub fn check_write(self, rows_affected: u64) -> Result<u64, StaleToken> {
        if rows_affected == 0 {
            Err(StaleToken {
                presented: self,
                highest: None,
            })
        } else {
            Ok(rows_affected)
        }
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A write carried a token lower than one the resource has already accepted: the lock
/// has passed to a later holder, and this one must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: the resource has seen {}", match .highest {
    Some(highest) => highest.to_string(),
    None => "a higher one".to_owned(),
})]
pub struct StaleToken {
    /// The token of the rejected write.
    pub presented: FencingToken,
    /// The highest token accepted so far, when the resource says
    /// ([`FencedResource`] does; a SQL `UPDATE … WHERE fence <= $token` only reports that
    /// it changed nothing, see [`FencingToken::check_write`]).
    pub highest: Option<FencingToken>,
}

/// A value guarded by fencing tokens: writes with a token lower than the highest seen are
/// rejected; the current holder may write repeatedly with the same token.
///
/// Under read-write locks and semaphores, readers fence too: a reader that reads with
/// [`read_fenced`](Self::read_fenced) records its token, so that a writer whose lease ended
/// before that reader was granted (a paused holder, a partitioned one) can no longer write
/// what the reader has read, and a reader whose token is older than an accepted write learns
/// that it was deposed. A plain [`read`](Self::read) records nothing: it protects a reader
/// against a newer writer only.
///
/// This is the in-process form of the check a real resource (a database row, an object
/// store's conditional put) should make; docs/fencing.md shows the SQL.
///
/// # Examples
///
/// ```
/// use distlock_core::{FencedResource, FencingToken};
///
/// let account = FencedResource::new(100);
/// account.write(FencingToken(7), |v| *v += 1)?;
/// account.write(FencingToken(7), |v| *v += 1)?; // same holder again: fine
/// assert!(account.write(FencingToken(6), |v| *v = 0).is_err()); // a paused old holder
/// assert_eq!(account.read(), 102);
///
/// // A reader granted after the writer with token 7 lost its lease reads with its token…
/// assert_eq!(account.read_fenced(FencingToken(9), |v| *v)?, 102);
/// // …so the deposed writer cannot change what that reader has read.
/// assert!(account.write(FencingToken(7), |v| *v = 0).is_err());
/// # Ok::<(), distlock_core::StaleToken>(())
/// ```
#[derive(Debug, Default)]
pub struct FencedResource<T> {
    inner: Mutex<Fenced<T>>,
}

/// The value and the tokens a [`FencedResource`] has seen.
#[derive(Debug, Default)]
struct Fenced<T> {
    /// The highest token of an accepted write or fenced read: writes below it are refused.
    highest: Option<FencingToken>,
    /// The highest token of an accepted write: fenced reads below it are refused.
    written: Option<FencingToken>,
    value: T,
}

/// The refusal of `token` if it is below `bar`.
fn refuse_below(token: FencingToken, bar: Option<FencingToken>) -> Result<(), StaleToken> {
    match bar {
        Some(highest) if token < highest => Err(StaleToken {
            presented: token,
            highest: Some(highest),
        }),
        _ => Ok(()),
    }
}

impl<T> FencedResource<T> {
    /// A resource holding `value` that has seen no token yet.
    pub fn new(value: T) -> Self {
        FencedResource {
            inner: Mutex::new(Fenced {
                highest: None,
                written: None,
                value,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Fenced<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `f` if `token` is at least the highest token seen (written, or read with
    /// [`read_fenced`](Self::read_fenced)), and records it.
    ///
    /// # Errors
    ///
    /// [`StaleToken`] if a higher token was seen before; `f` is not called.
    pub fn write<R>(
        &self,
        token: FencingToken,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StaleToken> {
        let mut state = self.state();
        refuse_below(token, state.highest)?;
        state.highest = Some(token);
        state.written = state.written.max(Some(token));
        Ok(f(&mut state.value))
    }

    /// Reads with a reader's `token`: applies `f` to the value if no write with a higher
    /// token was accepted, and records `token`, so that a later write with a lower token is
    /// refused. Readers of one read lock each read with their own token, in any order.
    ///
    /// A fenced read changes the resource (it records the token): where the resource is a
    /// database row, it is an `UPDATE`, not a `SELECT` (see docs/fencing.md).
    ///
    /// # Errors
    ///
    /// [`StaleToken`] if a write with a higher token was accepted: the lock has passed to a
    /// later writer, and this reader must stop; `f` is not called.
    pub fn read_fenced<R>(
        &self,
        token: FencingToken,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, StaleToken> {
        let mut state = self.state();
        refuse_below(token, state.written)?;
        state.highest = state.highest.max(Some(token));
        Ok(f(&state.value))
    }

    /// The highest token seen so far (written, or read with
    /// [`read_fenced`](Self::read_fenced)).
    pub fn highest(&self) -> Option<FencingToken> {
        self.state().highest
    }

    /// A copy of the current value, read without a token (nothing recorded).
    pub fn read(&self) -> T
    where
        T: Clone,
    {
        self.state().value.clone()
    }
}

/// sqlx support (feature `sqlx`): a token binds and decodes as the database's 64-bit
/// integer (`BIGINT`), wherever sqlx maps `i64`.
#[cfg(feature = "sqlx")]
mod sqlx_support {
    use super::FencingToken;
    use sqlx::encode::IsNull;
    use sqlx::error::BoxDynError;
    use sqlx::{Database, Decode, Encode, Type};

    impl<DB: Database> Type<DB> for FencingToken
    where
        i64: Type<DB>,
    {
        fn type_info() -> DB::TypeInfo {
            <i64 as Type<DB>>::type_info()
        }

        fn compatible(ty: &DB::TypeInfo) -> bool {
            <i64 as Type<DB>>::compatible(ty)
        }
    }

    impl<'q, DB: Database> Encode<'q, DB> for FencingToken
    where
        i64: Encode<'q, DB>,
    {
        fn encode_by_ref(
            &self,
            buf: &mut <DB as Database>::ArgumentBuffer,
        ) -> Result<IsNull, BoxDynError> {
            let value = self.as_i64().ok_or_else(|| {
                format!("fencing token {self} does not fit a signed 64-bit column")
            })?;
            <i64 as Encode<'q, DB>>::encode_by_ref(&value, buf)
        }

        fn size_hint(&self) -> usize {
            std::mem::size_of::<i64>()
        }
    }

    impl<'r, DB: Database> Decode<'r, DB> for FencingToken
    where
        i64: Decode<'r, DB>,
    {
        fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
            let value = <i64 as Decode<'r, DB>>::decode(value)?;
            let token = u64::try_from(value)
                .map_err(|_| format!("{value} is not a fencing token (negative)"))?;
            Ok(FencingToken(token))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readers of one read lock read in any order; a deposed writer cannot write under a
    /// newer reader, and a reader older than an accepted write is refused.
    #[test]
    fn readers_fence_older_writers() {
        let r = FencedResource::new(0);
        assert_eq!(r.write(FencingToken(5), |v| *v = 1), Ok(()));
        assert_eq!(r.read_fenced(FencingToken(8), |v| *v), Ok(1));
        assert_eq!(r.read_fenced(FencingToken(7), |v| *v), Ok(1));
        assert_eq!(r.highest(), Some(FencingToken(8)));
        let refused = r.write(FencingToken(5), |v| *v = 2).unwrap_err();
        assert_eq!(refused.highest, Some(FencingToken(8)));
        assert_eq!(r.write(FencingToken(9), |v| *v = 3), Ok(()));
        let deposed = r.read_fenced(FencingToken(8), |v| *v).unwrap_err();
        assert_eq!(deposed.highest, Some(FencingToken(9)));
        assert_eq!(r.read_fenced(FencingToken(9), |v| *v), Ok(3));
        // A plain read records nothing.
        let plain = FencedResource::new(0);
        plain.write(FencingToken(5), |v| *v = 1).unwrap();
        assert_eq!(plain.read(), 1);
        assert_eq!(plain.write(FencingToken(5), |v| *v = 2), Ok(()));
    }

    #[test]
    fn stale_token_messages() {
        let known = StaleToken {
            presented: FencingToken(6),
            highest: Some(FencingToken(7)),
        };
        assert_eq!(
            known.to_string(),
            "stale fencing token 6: the resource has seen 7"
        );
        let unknown = FencingToken(6).check_write(0).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "stale fencing token 6: the resource has seen a higher one"
        );
    }

    #[test]
    fn tokens_as_i64() {
        assert_eq!(FencingToken(0).as_i64(), Some(0));
        assert_eq!(FencingToken(i64::MAX as u64).as_i64(), Some(i64::MAX));
        assert_eq!(FencingToken(i64::MAX as u64 + 1).as_i64(), None);
    }
}
