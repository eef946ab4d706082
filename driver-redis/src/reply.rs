//! Reading the scripts' replies and the lock value they store.

use std::time::Duration;

use lockcore::FencingToken;
use redis::Value;

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
    let s = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.to_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => return None,
    };
    s.parse().ok().map(FencingToken)
}

/// A PTTL answer as a remaining TTL: `None` for "no expiry" or "no key".
#[doc(hidden)]
pub fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
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
