//! The hosts of a URL: each with its port and the credentials written in front of it.

use std::fmt;
use std::ops::Range;

use secrecy::SecretString;

use super::secret::{escape_controls, REDACTED};
use super::syntax::{decode, malformed};
use crate::LockError;

/// A user name and an optional password, from the userinfo of a URL.
#[derive(Clone)]
pub struct Credentials {
    /// The user name, percent-decoded (may be empty: `redis://:password@host`).
    pub user: String,
    /// The password, percent-decoded.
    pub password: Option<SecretString>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| REDACTED))
            .finish()
    }
}

/// One host of a URL, with the credentials written in front of it.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Credentials written before this host (`user:password@host`), if any.
    pub credentials: Option<Credentials>,
    /// The host name or address; IPv6 addresses keep their brackets (`[::1]`). Empty only
    /// for a URL whose authority names no host (`postgres://u@/db?host=/run/postgresql`).
    pub host: String,
    /// The port, if the URL gives one.
    pub port: Option<u16>,
}

impl Endpoint {
    /// `host:port`, with `default_port` when the URL gives none (never the credentials).
    pub fn host_port(&self, default_port: u16) -> String {
        format!("{}:{}", self.host, self.port.unwrap_or(default_port))
    }
}

/// How a message names the `n`th host of a URL: by its text (`host 'db:x'`) when that
/// text cannot hold a password, else by its place (`the second host`).
#[derive(Clone, Copy)]
pub(super) struct HostName<'a> {
    pub(super) n: usize,
    pub(super) text: Option<&'a str>,
}

impl fmt::Display for HostName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.text {
            Some(text) if !text.is_empty() => write!(f, "host '{}'", escape_controls(text)),
            _ => {
                let place = ["first", "second", "third", "fourth", "fifth"]
                    .get(self.n.wrapping_sub(1))
                    .map_or_else(|| format!("{}th", self.n), |p| (*p).to_owned());
                write!(f, "the {place} host")
            }
        }
    }
}

/// Parses one `host`, `host:port`, `[v6]` or `[v6]:port` (named `name` in errors).
pub(super) fn parse_host(
    text: &str,
    name: HostName<'_>,
) -> Result<(String, Option<u16>), LockError> {
    let n = name;
    let (name, port) = if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| malformed(format_args!("{n}: unclosed '[' of an IPv6 address")))?;
        if v6.is_empty()
            || !v6
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(malformed(format_args!("{n}: not an IPv6 address in [...]")));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| malformed(format_args!("{n}: expected ':port' after ']'")))?,
            ),
        };
        (format!("[{v6}]"), port)
    } else {
        match text.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (text.to_owned(), None),
        }
    };
    if name.is_empty() {
        return Err(malformed(format_args!(
            "{} is empty (a stray comma, or a password with an unencoded character?)",
            HostName { text: None, ..n }
        )));
    }
    let bad_char =
        |c: char| c.is_control() || c.is_whitespace() || "/?#@[]%,:\\\"<>^`{|}".contains(c);
    if !name.starts_with('[') && name.chars().any(bad_char) {
        return Err(malformed(format_args!(
            "{n} is not a host name or address (percent-encode '@', ':', ',' and '/' in credentials)"
        )));
    }
    let port = match port {
        None => None,
        Some("") => {
            return Err(malformed(format_args!(
                "{n} has an empty port (write one after the ':', or leave the ':' out)"
            )))
        }
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(port),
            _ => {
                return Err(malformed(format_args!(
                    "the port of {n} is not a number from 1 to 65535"
                )))
            }
        },
    };
    Ok((name, port))
}

/// Parses the `user[:password]` written before a host, never quoting it in errors.
pub(super) fn parse_credentials(
    text: &str,
    offset: usize,
    n: usize,
    secrets: &mut Vec<Range<usize>>,
) -> Result<Credentials, LockError> {
    let (user, password) = match text.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (text, None),
    };
    let n = HostName { n, text: None };
    let user = decode(user, false, &format!("the user name of {n}"))?;
    let password = match password {
        Some(p) => {
            if !p.is_empty() {
                let start = offset + text.len() - p.len();
                secrets.push(start..start + p.len());
            }
            Some(SecretString::from(decode(
                p,
                false,
                &format!("the password of {n}"),
            )?))
        }
        None => None,
    };
    if user.is_empty() && password.is_none() {
        return Err(malformed(format_args!(
            "empty credentials before '@' of {n}"
        )));
    }
    Ok(Credentials { user, password })
}
