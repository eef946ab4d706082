//! Reading the scripts' replies and the lock value they store.

use std::time::Duration;

use lockcore::driver::{AcquireOutcome, Contention, Grant, WaitHint};
use lockcore::{Claim, FencingToken, LockError, LockInfo, LockKey};
use redis::Value;

use crate::error;

/// An integer reply (or a string holding one).
#[doc(hidden)]
pub fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A fencing token reply (a string of digits, or an integer).
#[doc(hidden)]
pub fn as_token(v: &Value) -> Option<FencingToken> {
    let digits = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?,
        Value::SimpleString(s) => s.as_str(),
        Value::Int(i) => return u64::try_from(*i).ok().map(FencingToken),
        _ => return None,
    };
    digits.parse().ok().map(FencingToken)
}

/// Whether a token reply carries Redlock's written-back mark: the fencing write-back stores
/// `T` as `0T` (in a lock value and in a shared lease's data alike), and a grant's own
/// token never starts with `0` (an unfenced lock's token is `0` itself, one digit).
#[doc(hidden)]
pub fn written_back(token: &Value) -> bool {
    let digits: &[u8] = match token {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.as_bytes(),
        _ => return false,
    };
    digits.len() > 1 && digits.first() == Some(&b'0')
}

/// A PTTL answer as a remaining TTL: `None` for "no expiry" or "no key".
#[doc(hidden)]
pub fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// The answer of the acquire or claim script (see [`ACQUIRE`](crate::scripts::ACQUIRE) and
/// [`CLAIM`](crate::scripts::CLAIM)) to `claim` on `key` for `ttl`: granted, held
/// (with the `rev` the refusal saw as the wait hint), or the capacity mismatch error.
#[doc(hidden)]
pub fn acquire_outcome(
    reply: &[Value],
    key: &LockKey,
    claim: &Claim,
    ttl: Duration,
) -> Result<AcquireOutcome, LockError> {
    match reply {
        [flag, token] if as_int(flag) == Some(1) => {
            let token = as_token(token).ok_or_else(|| error::unexpected("acquire token"))?;
            Ok(AcquireOutcome::Acquired(Grant::new(token, ttl)))
        }
        [flag, pttl] if as_int(flag) == Some(0) => Ok(AcquireOutcome::Held(Contention::new(
            as_int(pttl).and_then(remaining),
        ))),
        [flag, wait, rev, rest @ ..] if as_int(flag) == Some(0) && rest.len() <= 1 => {
            let mut hint = match as_int(rev) {
                Some(rev) => WaitHint::at_revision(rev),
                None => WaitHint::none(),
            };
            // Whether the refusal recorded the owner's reservation (absent from the
            // replies of scripts before it).
            if let Some(kept) = rest.first() {
                hint = hint.with_reservation(as_int(kept) == Some(1));
            }
            Ok(AcquireOutcome::Held(
                Contention::new(as_int(wait).and_then(remaining)).with_hint(hint),
            ))
        }
        [flag, capacity] if as_int(flag) == Some(-1) => {
            let stored = as_int(capacity)
                .and_then(|c| u64::try_from(c).ok())
                .ok_or_else(|| error::unexpected("stored capacity"))?;
            Err(LockError::capacity_mismatch(key, stored, claim))
        }
        _ => Err(error::unexpected("acquire reply")),
    }
}

/// One lease as the inspect scripts list it: `{weight, capacity, token, label, pttl,
/// owner}`, without its owner token (see [`lease_owner`]).
#[doc(hidden)]
pub fn inspected(entry: &[Value]) -> Option<LockInfo> {
    let [weight, capacity, token, label, pttl, _owner] = entry else {
        return None;
    };
    let weight = u64::try_from(as_int(weight)?).ok()?;
    let capacity = u64::try_from(as_int(capacity)?).ok()?;
    let claim = Claim::from_parts(weight, capacity)?;
    let label = match label {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    Some(LockInfo::new(label, as_token(token)?, as_int(pttl).and_then(remaining)).with_claim(claim))
}

/// The owner token (hex) of a lease as the inspect scripts list it: for driver-redlock,
/// which groups an owner's copies on its instances by it; never shown to a user.
#[doc(hidden)]
pub fn lease_owner(entry: &[Value]) -> Option<String> {
    match entry.get(5)? {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// The token and label in a lock value `<owner hex><mark><token> <label>` (the mark is a
/// space, or `+` once a waiter watches it).
#[doc(hidden)]
pub fn parse_value(value: &[u8]) -> Option<(FencingToken, String)> {
    let (owner, rest) = (value.get(..32)?, value.get(32..)?);
    let (mark, rest) = rest.split_first()?;
    if !owner.iter().all(u8::is_ascii_hexdigit) || !matches!(mark, b' ' | b'+') {
        return None;
    }
    let rest = std::str::from_utf8(rest).ok()?;
    let (token, label) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((FencingToken(token.parse().ok()?), label.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse() {
        let owner = "0123456789abcdef0123456789abcdef";
        for mark in [' ', '+'] {
            let value = format!("{owner}{mark}1700000000123456 host/1 task");
            let (t, l) = parse_value(value.as_bytes()).unwrap();
            assert_eq!(t, FencingToken(1_700_000_000_123_456));
            assert_eq!(l, "host/1 task");
        }
        assert!(parse_value(format!("{owner}*17 x").as_bytes()).is_none());
        assert!(parse_value(b"garbage").is_none());
        assert!(parse_value(b"0123 1700000000123456 host/1 task").is_none());
    }
}
