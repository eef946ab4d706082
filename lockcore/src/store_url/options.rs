//! The option grammar (booleans, durations) and reading a URL's options, its user and its
//! password.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use super::url::{StoreUrl, Value};
use crate::LockError;

impl StoreUrl {
    /// The user name: the userinfo's of the first host, else the `user` option.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] when both are given.
    pub fn user(&self) -> Result<Option<String>, LockError> {
        let from_userinfo = self
            .endpoints
            .first()
            .and_then(|e| e.credentials.as_ref())
            .map(|c| c.user.clone())
            .filter(|u| !u.is_empty());
        let from_option = self.str_option("user")?.map(str::to_owned);
        match (from_userinfo, from_option) {
            (Some(_), Some(_)) => {
                Err(self.error("the user is given both before '@' and as ?user=; keep one"))
            }
            (a, b) => Ok(a.or(b)),
        }
    }

    /// The password: the userinfo's of the first host, else the `password` option (or
    /// `pass`, redis's name for it).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] when more than one is given.
    pub fn password(&self) -> Result<Option<SecretString>, LockError> {
        let mut found: Vec<SecretString> = self
            .endpoints
            .first()
            .and_then(|e| e.credentials.as_ref())
            .and_then(|c| c.password.clone())
            .into_iter()
            .collect();
        for key in ["password", "pass"] {
            found.extend(self.secret_option(key)?);
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            _ => Err(self.error(
                "the password is given more than once (before '@', ?password= or ?pass=); keep one",
            )),
        }
    }

    /// Refuses options not in `known` (an entry ending in `[` admits every key with that
    /// prefix, as PostgreSQL's `options[…]`) and options given more than once unless
    /// listed in `repeatable`.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the option and listing the known ones.
    pub fn check_options(&self, known: &[&str], repeatable: &[&str]) -> Result<(), LockError> {
        for (i, pair) in self.query.iter().enumerate() {
            let k = pair.key.as_str();
            let is_known = known
                .iter()
                .any(|n| *n == k || (n.ends_with('[') && k.starts_with(n)));
            if !is_known {
                let list = if known.is_empty() {
                    "none".to_owned()
                } else {
                    known
                        .iter()
                        .map(|n| {
                            if n.ends_with('[') {
                                format!("{n}NAME]")
                            } else {
                                (*n).to_owned()
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(LockError::config(format!(
                    "unknown option {k:?} in the {}: URL (known: {list})",
                    self.scheme
                )));
            }
            if !repeatable.contains(&k) && self.query[..i].iter().any(|p| p.key == k) {
                return Err(LockError::config(format!(
                    "option {k:?} is given more than once in the {}: URL",
                    self.scheme
                )));
            }
        }
        Ok(())
    }

    /// Whether the URL has option `key` (with or without a value).
    pub fn has_option(&self, key: &str) -> bool {
        self.query.iter().any(|p| p.key == key)
    }

    fn last(&self, key: &str) -> Option<&Value> {
        self.query
            .iter()
            .rev()
            .find(|p| p.key == key)
            .map(|p| &p.value)
    }

    /// The value of option `key` (the last one if repeated).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] when the option is given without `=value`.
    pub fn str_option(&self, key: &str) -> Result<Option<&str>, LockError> {
        match self.last(key) {
            None => Ok(None),
            Some(Value::Plain(v)) => Ok(Some(v)),
            Some(Value::Secret(v)) => Ok(Some(v.expose_secret())),
            Some(Value::Flag) => Err(LockError::config(format!(
                "option {key} of the {}: URL needs a value ({key}=…)",
                self.scheme
            ))),
        }
    }

    /// The value of a secret option (every occurrence is redacted).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] when the option is given without `=value`.
    pub fn secret_option(&self, key: &str) -> Result<Option<SecretString>, LockError> {
        match self.last(key) {
            None => Ok(None),
            Some(Value::Secret(v)) => Ok(Some(v.clone())),
            Some(Value::Plain(v)) => Ok(Some(SecretString::from(v.as_str()))),
            Some(Value::Flag) => Err(LockError::config(format!(
                "option {key} of the {}: URL needs a value ({key}=…)",
                self.scheme
            ))),
        }
    }

    /// Option `key` as a boolean ([`parse_bool`]); `?key` alone is `true`.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a value that is not a boolean.
    pub fn bool_option(&self, key: &str) -> Result<Option<bool>, LockError> {
        match self.last(key) {
            None => Ok(None),
            Some(Value::Flag) => Ok(Some(true)),
            Some(_) => {
                let v = self.str_option(key)?.unwrap_or_default();
                parse_bool(v).map(Some).map_err(|e| {
                    LockError::config(format!("option {key} of the {}: URL: {e}", self.scheme))
                })
            }
        }
    }

    /// Option `key` as a duration ([`parse_duration`]).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a value that is not a duration with a unit.
    pub fn duration_option(&self, key: &str) -> Result<Option<Duration>, LockError> {
        match self.str_option(key)? {
            None => Ok(None),
            Some(v) => parse_duration(v).map(Some).map_err(|e| {
                LockError::config(format!("option {key} of the {}: URL: {e}", self.scheme))
            }),
        }
    }
}

/// One boolean grammar for every URL option: `true`/`false`, `1`/`0`, `yes`/`no`,
/// `on`/`off`, in any case.
///
/// # Errors
///
/// A message saying what to write, quoting `value`.
///
/// # Examples
///
/// ```
/// use distlock_core::store_url::parse_bool;
///
/// assert_eq!(parse_bool("Yes"), Ok(true));
/// assert_eq!(parse_bool("OFF"), Ok(false));
/// assert!(parse_bool("maybe").is_err());
/// ```
pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{value:?} is not a boolean (write true or false; 1/0, yes/no and on/off work too)"
        )),
    }
}

/// One duration grammar for every URL option (and the CLI's flags): a number with a unit
/// as `humantime` reads it (`500ms`, `5s`, `1.5s`, `5m`, `1h 30m`). A bare number is
/// refused: stores disagree on whether it means seconds or milliseconds.
///
/// # Errors
///
/// A message saying what to write, quoting `value`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use distlock_core::store_url::parse_duration;
///
/// assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
/// assert!(parse_duration("5").unwrap_err().contains("write 500ms or 5s"));
/// ```
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    if !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "{value:?} has no unit: write 500ms or 5s (a bare number would be ambiguous)"
        ));
    }
    humantime::parse_duration(v)
        .map_err(|e| format!("{value:?} is not a duration ({e}); write e.g. 500ms, 5s or 5m"))
}
