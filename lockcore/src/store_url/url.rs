//! [`StoreUrl`]: parsing a whole URL, reading its parts and writing it back redacted.

use std::fmt;

use secrecy::SecretString;

use super::endpoint::{parse_credentials, parse_host, Endpoint, HostName};
use super::secret::{escape_controls, is_secret_key, redact_unparsed, REDACTED};
use super::syntax::{decode, encode, malformed, scheme_of};
use crate::LockError;

/// Schemes whose URLs name a path rather than hosts: `sqlite:PATH`, `sqlite://PATH`,
/// `memory:NAME`, `memory://NAME`.
pub const PATH_SCHEMES: &[&str] = &["sqlite", "memory"];

/// The value of one option, as parsed (a secret one held as a secret from the start).
#[derive(Clone)]
pub(super) enum Value {
    /// `?key` without `=`.
    Flag,
    Plain(String),
    Secret(SecretString),
}

/// One `key=value` of the query, in the order written.
#[derive(Clone)]
pub(super) struct Pair {
    pub(super) key: String,
    pub(super) value: Value,
}

/// A parsed lock store URL; see the [module docs](crate::store_url) for the syntax.
///
/// `Display` and `Debug` show the URL redacted (passwords and secret options as `***`).
#[derive(Clone)]
pub struct StoreUrl {
    pub(super) scheme: String,
    /// Written with `//` after the scheme.
    slashes: bool,
    pub(super) endpoints: Vec<Endpoint>,
    /// As written (percent-encoded), with its leading `/` for URLs with hosts.
    path: String,
    pub(super) query: Vec<Pair>,
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
/// `***`, and its control characters escaped, for messages and logs. In a URL that does
/// not parse, everything from the first `:` after `scheme://` to the last `@` is hidden
/// (a password with an unencoded character may reach that far).
///
/// # Examples
///
/// ```
/// use distlock_core::store_url::redact;
///
/// assert_eq!(redact("redis://u:lock@h:6379/0"), "redis://u:***@h:6379/0");
/// assert_eq!(redact("mysql://u@h/db?password=a%26b&password=c"), "mysql://u@h/db?password=***&password=***");
/// assert_eq!(redact("redis://u:se/cret@h:notaport"), "redis://u:***@h:notaport");
/// ```
pub fn redact(url: &str) -> String {
    match StoreUrl::parse(url) {
        Ok(parsed) => parsed.redacted,
        Err(_) => redact_unparsed(url),
    }
}

impl StoreUrl {
    /// Parses `url`; see the [module docs](crate::store_url) for the syntax. The scheme is
    /// compared and kept in lower case.
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
                // A host's text is quoted in errors only where it cannot be a password's
                // (one with an unencoded '/' or ',' ends the authority or entry early).
                let any_at = url.contains('@');
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
                            let text = (entry.contains('@') || !any_at).then_some(host);
                            parse_host(host, HostName { n, text })?
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
        let redacted = if slashes || path_schemes {
            escape_controls(&redacted)
        } else {
            // `u:pw@host` parses as scheme `u` and path `pw@host`: a forgotten `redis://`
            // must not show the password.
            redact_unparsed(url)
        };
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

    /// Where the URL points, for messages ([`LockError::at`]): its hosts as `host:port`
    /// (`default_port` where none is written), comma-separated, or its decoded path for a
    /// URL without hosts (`sqlite:PATH`, `redis+unix:///run/redis.sock`). Never
    /// credentials.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_core::store_url::StoreUrl;
    ///
    /// let url = StoreUrl::parse("redlock://u:pw@a,b:7000/").unwrap();
    /// assert_eq!(url.place(6379), "a:6379,b:7000");
    /// assert_eq!(StoreUrl::parse("sqlite:/var/lib/locks.db").unwrap().place(0), "/var/lib/locks.db");
    /// ```
    pub fn place(&self, default_port: u16) -> String {
        let hosts: Vec<String> = self
            .endpoints
            .iter()
            .filter(|e| !e.host.is_empty())
            .map(|e| e.host_port(default_port))
            .collect();
        if hosts.is_empty() {
            escape_controls(&self.decoded_path().unwrap_or_else(|_| self.path.clone()))
        } else {
            hosts.join(",")
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

    /// A [`LockError::Config`] about this URL, showing it redacted.
    pub fn error(&self, what: impl fmt::Display) -> LockError {
        LockError::config(format!("{what} (in {})", self.redacted))
    }

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
