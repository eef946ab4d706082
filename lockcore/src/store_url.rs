//! Lock store URLs: one parser, one option grammar and one redaction for the facade, every
//! driver and the CLI.
//!
//! ```text
//! scheme://[user[:password]@]host[:port][,[user[:password]@]host[:port]…][/path][?key=value&…][#fragment]
//! scheme:path[?key=value&…]              (sqlite:, memory: — no host)
//! ```
//!
//! * **Hosts**: a name, an IPv4 address or a bracketed IPv6 address (`[::1]:7000`), with an
//!   optional port; several separated by commas where a store has several (`redlock://`,
//!   `etcd://`). The driver picks the default port.
//! * **Credentials**: percent-encoded (`%40` for `@`, `%3A` for `:`, `%2C` for `,`, `%2F`
//!   for `/`). The password is held as a [`SecretString`] from here to the connection: it
//!   is never formatted, and `Debug` shows `***`.
//! * **Options**: `key=value` pairs, percent-encoded, `+` for a space. Each driver lists the
//!   ones it knows ([`StoreUrl::check_options`]) and refuses the rest with that list. One
//!   grammar for every store:
//!   * booleans: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off` (any case); a key alone
//!     (`?fair`) is `true`;
//!   * durations: a number with a unit, as `humantime` reads it (`500ms`, `5s`, `1.5s`,
//!     `5m`); a bare number is refused ("write 500ms or 5s"), since stores disagree on
//!     whether it means seconds or milliseconds;
//!   * a password may also be given as `?password=…` (the same secret, refused if the
//!     userinfo has one too), and the user as `?user=…`.
//!
//! **Redaction** is by parsing, never by searching the text for the password: the userinfo
//! password and the value of every secret option ([`is_secret_key`]: `password`, `pass`,
//! `sslpassword`, `token`, `secret`, `auth`, `api_key`, …) become `***`, whatever they
//! contain and however often they appear. A URL that does not parse is never echoed:
//! [`redact`] then shows only its scheme.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use lockcore::store_url::{redact, ExposeSecret, StoreUrl};
//!
//! let url = StoreUrl::parse("etcd://app:s%40fe@e1,e2:2479/billing?timeout=2s&fair").unwrap();
//! assert_eq!(url.scheme(), "etcd");
//! assert_eq!(url.endpoints().len(), 2);
//! assert_eq!(url.endpoints()[1].port, Some(2479));
//! assert_eq!(url.password().unwrap().unwrap().expose_secret(), "s@fe");
//! url.check_options(&["timeout", "fair"], &[]).unwrap();
//! assert_eq!(url.duration_option("timeout").unwrap(), Some(Duration::from_secs(2)));
//! assert_eq!(url.bool_option("fair").unwrap(), Some(true));
//! assert_eq!(url.to_string(), "etcd://app:***@e1,e2:2479/billing?timeout=2s&fair");
//! assert!(!format!("{url:?}").contains("s%40fe"));
//!
//! assert_eq!(redact("postgres://u@db/app?sslmode=require&password=lock"),
//!            "postgres://u@db/app?sslmode=require&password=***");
//! ```

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use crate::LockError;

pub use secrecy::{ExposeSecret, SecretString};

/// The text that stands for a secret in redacted URLs and `Debug` output.
pub const REDACTED: &str = "***";

/// Schemes whose URLs name a path rather than hosts: `sqlite:PATH`, `sqlite://PATH`,
/// `memory:NAME`, `memory://NAME`.
pub const PATH_SCHEMES: &[&str] = &["sqlite", "memory"];

/// Option keys whose value is a secret (compared ignoring case, `-` and `_`): the ones of
/// redis (`pass`, `password`), libpq/sqlx PostgreSQL (`password`, `sslpassword`), MySQL
/// (`password`), etcd (`password`, `token`) and the usual names of API tokens.
const SECRET_KEYS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "pwd",
    "sslpassword",
    "sslkeypassword",
    "token",
    "authtoken",
    "accesstoken",
    "auth",
    "secret",
    "clientsecret",
    "apikey",
    "key_password",
];

/// Whether an option with this key carries a secret: the known secret keys (`password`,
/// `pass`, `passwd`, `pwd`, `sslpassword`, `token`, `auth`, `secret`, `api_key`, …)
/// and any key containing `password`, `passwd`, `secret` or `token`, ignoring case,
/// `-` and `_`.
///
/// # Examples
///
/// ```
/// use lockcore::store_url::is_secret_key;
///
/// assert!(is_secret_key("sslpassword") && is_secret_key("API-Key") && is_secret_key("pass"));
/// assert!(!is_secret_key("sslmode") && !is_secret_key("key") && !is_secret_key("timeout"));
/// ```
pub fn is_secret_key(key: &str) -> bool {
    let norm: String = key
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    SECRET_KEYS.iter().any(|k| k.replace('_', "") == norm)
        || ["password", "passwd", "secret", "token"]
            .iter()
            .any(|w| norm.contains(w))
}

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

#[derive(Clone)]
enum Value {
    /// `?key` without `=`.
    Flag,
    Plain(String),
    Secret(SecretString),
}

#[derive(Clone)]
struct Pair {
    key: String,
    value: Value,
}

/// A parsed lock store URL; see the [module docs](self) for the syntax.
///
/// `Display` and `Debug` show the URL redacted (passwords and secret options as `***`).
#[derive(Clone)]
pub struct StoreUrl {
    scheme: String,
    /// Written with `//` after the scheme.
    slashes: bool,
    endpoints: Vec<Endpoint>,
    /// As written (percent-encoded), with its leading `/` for URLs with hosts.
    path: String,
    query: Vec<Pair>,
    fragment: Option<String>,
    redacted: String,
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.redacted).finish()
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// `url` with its userinfo password and the values of its secret options replaced by
/// `***`, for messages and logs. A URL that does not parse shows only its scheme.
///
/// # Examples
///
/// ```
/// use lockcore::store_url::redact;
///
/// assert_eq!(redact("redis://u:lock@h:6379/0"), "redis://u:***@h:6379/0");
/// assert_eq!(redact("mysql://u@h/db?password=a%26b&password=c"), "mysql://u@h/db?password=***&password=***");
/// assert_eq!(redact("redis://u:secret@h:notaport"), "redis:<malformed URL, not shown>");
/// ```
pub fn redact(url: &str) -> String {
    match StoreUrl::parse(url) {
        Ok(parsed) => parsed.redacted,
        Err(_) => match scheme_of(url) {
            Some(scheme) => format!("{scheme}:<malformed URL, not shown>"),
            None => "<malformed URL, not shown>".to_owned(),
        },
    }
}

/// The scheme of `url` if it starts with a syntactically valid one (`[A-Za-z][A-Za-z0-9+.-]*:`).
fn scheme_of(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

fn malformed(what: impl fmt::Display) -> LockError {
    LockError::config(format!("malformed lock store URL: {what}"))
}

/// Percent-decodes `raw` strictly (a `%` must start a two-digit hex escape), optionally
/// reading `+` as a space; `what` names the part in errors (never its text).
fn decode(raw: &str, plus_is_space: bool, what: &str) -> Result<String, LockError> {
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

fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

/// Parses one `host`, `host:port`, `[v6]` or `[v6]:port` (the `n`th host, for errors).
fn parse_host(text: &str, n: usize) -> Result<(String, Option<u16>), LockError> {
    let (name, port) = if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| malformed(format_args!("host {n}: unclosed '[' of an IPv6 address")))?;
        if v6.is_empty()
            || !v6
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(malformed(format_args!(
                "host {n}: not an IPv6 address in [...]"
            )));
        }
        let port =
            match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| {
                    malformed(format_args!("host {n}: expected ':port' after ']'"))
                })?),
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
            "host {n} is empty (a stray comma, or a password with an unencoded character?)"
        )));
    }
    let bad_char =
        |c: char| c.is_control() || c.is_whitespace() || "/?#@[]%,:\\\"<>^`{|}".contains(c);
    if !name.starts_with('[') && name.chars().any(bad_char) {
        return Err(malformed(format_args!(
            "host {n} is not a host name or address (percent-encode '@', ':', ',' and '/' in credentials)"
        )));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(port),
            _ => {
                return Err(malformed(format_args!(
                    "the port of host {n} is not a number from 1 to 65535"
                )))
            }
        },
    };
    Ok((name, port))
}

fn parse_credentials(
    text: &str,
    offset: usize,
    n: usize,
    secrets: &mut Vec<Range<usize>>,
) -> Result<Credentials, LockError> {
    let (user, password) = match text.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (text, None),
    };
    let user = decode(user, false, &format!("the user name of host {n}"))?;
    let password = match password {
        Some(p) => {
            if !p.is_empty() {
                let start = offset + text.len() - p.len();
                secrets.push(start..start + p.len());
            }
            Some(SecretString::from(decode(
                p,
                false,
                &format!("the password of host {n}"),
            )?))
        }
        None => None,
    };
    if user.is_empty() && password.is_none() {
        return Err(malformed(format_args!(
            "empty credentials before '@' of host {n}"
        )));
    }
    Ok(Credentials { user, password })
}

impl StoreUrl {
    /// Parses `url`; see the [module docs](self) for the syntax. The scheme is compared
    /// and kept in lower case.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the part that is wrong, never quoting a credential or
    /// an option value.
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let scheme_text = scheme_of(url).ok_or_else(|| {
            malformed("expected SCHEME:… (e.g. redis://host:6379/, postgres://host/db, sqlite:PATH, memory:)")
        })?;
        let scheme = scheme_text.to_ascii_lowercase();
        let mut pos = scheme_text.len() + 1;
        let slashes = url[pos..].starts_with("//");
        if slashes {
            pos += 2;
        }
        let mut secrets = Vec::new();
        let mut endpoints = Vec::new();
        let rest = &url[pos..];
        // The fragment is split off first: a '#' elsewhere must be percent-encoded.
        let (body, fragment) = match rest.split_once('#') {
            Some((b, f)) => (b, Some(f.to_owned())),
            None => (rest, None),
        };
        let path_schemes = PATH_SCHEMES.contains(&scheme.as_str());
        let path_start = if slashes && !path_schemes {
            let end = body.find(['/', '?']).unwrap_or(body.len());
            let authority = &body[..end];
            if !authority.is_empty() {
                let mut offset = pos;
                let entries: Vec<&str> = authority.split(',').collect();
                for (i, entry) in entries.iter().enumerate() {
                    let n = i + 1;
                    let (credentials, host) = match entry.rsplit_once('@') {
                        Some((c, h)) => (Some(parse_credentials(c, offset, n, &mut secrets)?), h),
                        None => (None, *entry),
                    };
                    let (host, port) =
                        if host.is_empty() && entries.len() == 1 && credentials.is_some() {
                            (String::new(), None)
                        } else {
                            parse_host(host, n)?
                        };
                    endpoints.push(Endpoint {
                        credentials,
                        host,
                        port,
                    });
                    offset += entry.len() + 1;
                }
            }
            end
        } else {
            0
        };
        let after = &body[path_start..];
        let (path, query) = match after.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (after, None),
        };
        if path.chars().any(char::is_control) {
            return Err(malformed("the path contains a control character"));
        }
        let mut pairs = Vec::new();
        if let Some(query) = query {
            let mut offset = pos + path_start + path.len() + 1;
            for raw in query.split('&') {
                if !raw.is_empty() {
                    let (k, v) = match raw.split_once('=') {
                        Some((k, v)) => (k, Some(v)),
                        None => (raw, None),
                    };
                    let key = decode(k, true, "an option name")?;
                    let secret = is_secret_key(&key);
                    let value = match v {
                        None => Value::Flag,
                        Some(v) if secret => {
                            if !v.is_empty() {
                                let start = offset + k.len() + 1;
                                secrets.push(start..start + v.len());
                            }
                            Value::Secret(SecretString::from(decode(
                                v,
                                true,
                                &format!("the value of option {key}"),
                            )?))
                        }
                        Some(v) => {
                            Value::Plain(decode(v, true, &format!("the value of option {key}"))?)
                        }
                    };
                    pairs.push(Pair { key, value });
                }
                offset += raw.len() + 1;
            }
        }
        let mut redacted = String::with_capacity(url.len());
        let mut last = 0;
        for r in &secrets {
            redacted.push_str(&url[last..r.start]);
            redacted.push_str(REDACTED);
            last = r.end;
        }
        redacted.push_str(&url[last..]);
        Ok(StoreUrl {
            scheme,
            slashes,
            endpoints,
            path: path.to_owned(),
            query: pairs,
            fragment,
            redacted,
        })
    }

    /// A URL of `scheme` for one host, with `credentials`, `path` (as written,
    /// percent-encoded, with its leading `/`) and no options: what a multi-host URL becomes
    /// for each of its hosts (e.g. one `redis://` URL per Redlock instance).
    pub fn for_endpoint(scheme: &str, endpoint: Endpoint, path: &str) -> Self {
        let mut url = StoreUrl {
            scheme: scheme.to_ascii_lowercase(),
            slashes: true,
            endpoints: vec![endpoint],
            path: path.to_owned(),
            query: Vec::new(),
            fragment: None,
            redacted: String::new(),
        };
        url.redacted = url.render(&[], true);
        url
    }

    /// The scheme, in lower case.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The hosts, in the order written (empty for `sqlite:`/`memory:` URLs and URLs
    /// without an authority such as `redis+unix:///path`).
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The only host, for stores that take one.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] when the URL names no host or several.
    pub fn single_endpoint(&self) -> Result<&Endpoint, LockError> {
        match self.endpoints.as_slice() {
            [one] if !one.host.is_empty() => Ok(one),
            [] | [_] => Err(LockError::config(format!(
                "the {}:// URL names no host (expected {}://host[:port]/…)",
                self.scheme, self.scheme
            ))),
            many => Err(LockError::config(format!(
                "a {}:// URL names one host, not {} (a comma-separated host list is for redlock:// and etcd://)",
                self.scheme,
                many.len()
            ))),
        }
    }

    /// The path as written (percent-encoded): with its leading `/` for URLs with hosts
    /// (`/0`, `/app`), the whole path for `sqlite:` and `memory:` URLs.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path percent-decoded, without the leading `/` of URLs with hosts.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a bad `%` escape or a path that is not UTF-8 once decoded.
    pub fn decoded_path(&self) -> Result<String, LockError> {
        let path = if self.slashes && !PATH_SCHEMES.contains(&self.scheme.as_str()) {
            self.path.strip_prefix('/').unwrap_or(&self.path)
        } else {
            &self.path
        };
        decode(path, false, "the path")
    }

    /// The fragment (after `#`), as written.
    pub fn fragment(&self) -> Option<&str> {
        self.fragment.as_deref()
    }

    /// The URL, redacted: the same as its `Display`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

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

    /// A [`LockError::Config`] about this URL, showing it redacted.
    pub fn error(&self, what: impl fmt::Display) -> LockError {
        LockError::config(format!("{what} (in {})", self.redacted))
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

    /// The URL without its passwords and secret options, and without the options named in
    /// `drop`: what may be handed to a client library (whose errors may quote it) while the
    /// secrets are passed to it separately.
    pub fn without_secrets(&self, drop: &[&str]) -> String {
        let kept: Vec<&Pair> = self
            .query
            .iter()
            .filter(|p| !drop.contains(&p.key.as_str()))
            .collect();
        let mut out = self.render(&kept, false);
        if let Some(f) = &self.fragment {
            out.push('#');
            out.push_str(f);
        }
        out
    }

    /// Writes the URL from its parts: secrets as `***` (`redact`) or left out.
    fn render(&self, pairs: &[&Pair], redact: bool) -> String {
        let mut out = format!("{}:", self.scheme);
        if self.slashes {
            out.push_str("//");
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if let Some(c) = &e.credentials {
                out.push_str(&encode(&c.user));
                if c.password.is_some() && redact {
                    out.push(':');
                    out.push_str(REDACTED);
                }
                if !c.user.is_empty() || (c.password.is_some() && redact) {
                    out.push('@');
                }
            }
            out.push_str(&e.host);
            if let Some(p) = e.port {
                out.push_str(&format!(":{p}"));
            }
        }
        out.push_str(&self.path);
        let mut first = true;
        for p in pairs {
            let value = match &p.value {
                Value::Flag => None,
                Value::Plain(v) => Some(encode(v)),
                Value::Secret(_) if redact => Some(REDACTED.to_owned()),
                Value::Secret(_) => continue,
            };
            out.push(if first { '?' } else { '&' });
            first = false;
            out.push_str(&encode(&p.key));
            if let Some(v) = value {
                out.push('=');
                out.push_str(&v);
            }
        }
        out
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
/// use lockcore::store_url::parse_bool;
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
/// use lockcore::store_url::parse_duration;
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

/// The usual port of each store, for guessing a forgotten scheme.
const PORT_SCHEMES: &[(u16, &str)] = &[
    (6379, "redis"),
    (6380, "rediss"),
    (5432, "postgres"),
    (3306, "mysql"),
    (2379, "etcd"),
];

/// For text that looks like `host:port` or `host` without a scheme (`localhost:6379`,
/// `127.0.0.1:5432`, `db.example:2379`), the URL it probably meant, guessed from the port
/// (`redis://localhost:6379`); `None` when the port is not a store's usual one or the text
/// does not look like a host.
///
/// # Examples
///
/// ```
/// use lockcore::store_url::guess_missing_scheme;
///
/// assert_eq!(guess_missing_scheme("localhost:6379").as_deref(), Some("redis://localhost:6379"));
/// assert_eq!(guess_missing_scheme("db.example:2379/ns").as_deref(), Some("etcd://db.example:2379/ns"));
/// assert_eq!(guess_missing_scheme("db.example:1234"), None);
/// assert_eq!(guess_missing_scheme("redis://h"), None);
/// ```
pub fn guess_missing_scheme(text: &str) -> Option<String> {
    if !looks_like_host_port(text) {
        return None;
    }
    let authority = text.split(['/', '?']).next().unwrap_or(text);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let port: u16 = host.rsplit_once(':')?.1.parse().ok()?;
    let scheme = PORT_SCHEMES.iter().find(|(p, _)| *p == port)?.1;
    Some(redact(&format!("{scheme}://{text}")))
}

/// Whether `text` is a host with a port and no scheme: `localhost:6379`, `10.0.0.1:5432/db`.
pub fn looks_like_host_port(text: &str) -> bool {
    if text.contains("://") {
        return false;
    }
    let authority = text.split(['/', '?']).next().unwrap_or(text);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match host.rsplit_once(':') {
        Some((name, port)) => {
            !name.is_empty()
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests;
