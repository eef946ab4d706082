//! The lexical pieces of a URL: its scheme, percent-escapes, and the error for a URL that
//! does not parse (which never quotes the text).

use std::fmt;

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use crate::LockError;

/// The scheme of `url` if it starts with a syntactically valid one (`[A-Za-z][A-Za-z0-9+.-]*:`).
pub(super) fn scheme_of(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

pub(super) fn malformed(what: impl fmt::Display) -> LockError {
    LockError::config(format!("malformed lock store URL: {what}"))
}

/// Percent-decodes `raw` strictly (a `%` must start a two-digit hex escape), optionally
/// reading `+` as a space; `what` names the part in errors (never its text).
pub(super) fn decode(raw: &str, plus_is_space: bool, what: &str) -> Result<String, LockError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .ok_or_else(|| {
                        malformed(format_args!("a '%' in {what} that starts no %XX escape"))
                    })?;
                let hi = (hex[0] as char).to_digit(16).unwrap_or(0) as u8;
                let lo = (hex[1] as char).to_digit(16).unwrap_or(0) as u8;
                out.push(hi * 16 + lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| malformed(format_args!("{what} is not UTF-8 once decoded")))
}

/// Characters escaped when a user name or option is written back into a URL.
const COMPONENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'+')
    .add(b',')
    .add(b'/')
    .add(b':')
    .add(b'=')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b']');

pub(super) fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}
