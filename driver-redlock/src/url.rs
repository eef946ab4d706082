//! The `redlock://` URL: a host list the `url` crate cannot parse, so we parse it here.
//!
//! ```text
//! redlock://[user[:password]@]host[:port][,[user[:password]@]host[:port]…][/db][?option=value&…]
//! redlocks://…                      (every instance over TLS, like rediss://)
//! ```
//!
//! Credentials on the first entry apply to every entry that carries none of its own; an
//! entry with its own credentials uses those. Passwords stay percent-encoded as written
//! (they are passed on inside a `redis://` URL, which decodes them). The port defaults to
//! 6379. Options: `prefix`, `timeout` (the per-instance timeout, e.g. `50ms`, `1s`),
//! `connect_timeout`, `tls` (`true`/`false`), `fencing` (`true`/`false`).

use std::time::Duration;

use lockcore::LockError;

/// What a `redlock://` URL says.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ParsedUrl {
    /// One `redis://` or `rediss://` URL per instance.
    pub(crate) instances: Vec<String>,
    pub(crate) prefix: Option<String>,
    pub(crate) instance_timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) fencing: Option<bool>,
}

impl std::fmt::Debug for ParsedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParsedUrl")
            .field("instances", &self.instances.len())
            .field("prefix", &self.prefix)
            .field("instance_timeout", &self.instance_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("fencing", &self.fencing)
            .finish()
    }
}

const SYNTAX: &str =
    "expected redlock://[user:password@]host:port,host:port,host:port[/db][?prefix=…&timeout=…]";

fn bad(what: impl std::fmt::Display) -> LockError {
    LockError::config(format!("malformed redlock URL: {what}; {SYNTAX}"))
}

/// Parses a `redlock://` or `redlocks://` URL. Errors never echo a password.
pub(crate) fn parse(url: &str) -> Result<ParsedUrl, LockError> {
    let (mut tls, rest) = if let Some(rest) = url.strip_prefix("redlock://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("redlocks://") {
        (true, rest)
    } else {
        let scheme = url.split("://").next().unwrap_or("");
        return Err(bad(format_args!(
            "the scheme must be redlock:// or redlocks://, not {:?}",
            if url.contains("://") { scheme } else { "" }
        )));
    };
    // The host list ends at the first '/', '?' or '#' (none may appear in an entry: a
    // password with one of them must be percent-encoded).
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (hosts, tail) = rest.split_at(end);
    if tail.starts_with('#') {
        return Err(bad("a fragment (#…) is not allowed"));
    }
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    let db = match path.strip_prefix('/') {
        None | Some("") => None,
        Some(db) => match db.parse::<u32>() {
            Ok(n) if db.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(bad(format_args!("the database {db:?} is not a number"))),
        },
    };
    let mut parsed = ParsedUrl {
        instances: Vec::new(),
        prefix: None,
        instance_timeout: None,
        connect_timeout: None,
        fencing: None,
    };
    if let Some(query) = query {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "prefix" => parsed.prefix = Some(percent_decode(value)?),
                "timeout" => parsed.instance_timeout = Some(duration(name, value)?),
                "connect_timeout" => parsed.connect_timeout = Some(duration(name, value)?),
                "tls" => tls = boolean(name, value)?,
                "fencing" => parsed.fencing = Some(boolean(name, value)?),
                other => {
                    return Err(bad(format_args!(
                        "unknown option {other:?} (known: prefix, timeout, connect_timeout, tls, fencing)"
                    )))
                }
            }
        }
    }
    if hosts.is_empty() {
        return Err(bad("no instances"));
    }
    let mut default_credentials: Option<&str> = None;
    for (i, entry) in hosts.split(',').enumerate() {
        let (credentials, host) = match entry.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, entry),
        };
        if let Some(c) = credentials {
            check_credentials(c, i)?;
            if i == 0 {
                default_credentials = Some(c);
            }
        }
        let (host, port) = host_port(host, i)?;
        let credentials = credentials.or(default_credentials);
        let scheme = if tls { "rediss" } else { "redis" };
        let mut instance = format!("{scheme}://");
        if let Some(c) = credentials {
            instance.push_str(c);
            instance.push('@');
        }
        instance.push_str(&format!("{host}:{port}/"));
        if let Some(db) = db {
            instance.push_str(&db.to_string());
        }
        parsed.instances.push(instance);
    }
    Ok(parsed)
}

fn check_credentials(c: &str, i: usize) -> Result<(), LockError> {
    let (user, password) = c.split_once(':').unwrap_or((c, ""));
    let ok = |s: &str| {
        s.chars()
            .all(|ch| !ch.is_control() && !matches!(ch, '@' | ',' | '/' | '?' | '#' | ' '))
    };
    if user.contains(':') || !ok(user) || !ok(password) {
        return Err(bad(format_args!(
            "the credentials of instance {} contain a character that must be percent-encoded",
            i + 1
        )));
    }
    if c.is_empty() {
        return Err(bad(format_args!(
            "empty credentials before '@' in instance {}",
            i + 1
        )));
    }
    Ok(())
}

fn host_port(entry: &str, i: usize) -> Result<(String, u16), LockError> {
    let n = i + 1;
    if entry.is_empty() {
        return Err(bad(format_args!("instance {n} is empty (a stray comma?)")));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err(bad(format_args!(
                "instance {n}: unclosed '[' in an IPv6 address"
            )));
        };
        if v6.is_empty()
            || !v6
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(bad(format_args!(
                "instance {n}: {v6:?} is not an IPv6 address"
            )));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| bad(format_args!("instance {n}: expected ':port' after ']'")))?,
            ),
        };
        (format!("[{v6}]"), port)
    } else {
        let (h, p) = match entry.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        };
        if h.is_empty()
            || !h
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
        {
            return Err(bad(format_args!("instance {n}: {h:?} is not a host name")));
        }
        (h.to_owned(), p)
    };
    let port = match port {
        None => 6379,
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 && p.bytes().all(|b| b.is_ascii_digit()) => port,
            _ => return Err(bad(format_args!("instance {n}: {p:?} is not a port"))),
        },
    };
    Ok((host, port))
}

fn boolean(name: &str, value: &str) -> Result<bool, LockError> {
    match value {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(bad(format_args!("{name}={value:?} is not true or false"))),
    }
}

/// `250ms`, `1s`, `1.5s`.
fn duration(name: &str, value: &str) -> Result<Duration, LockError> {
    let (number, scale) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(bad(format_args!(
            "{name}={value:?} needs a unit (e.g. 50ms or 1s)"
        )));
    };
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale <= 3600.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(bad(format_args!(
            "{name}={value:?} is not a duration above zero and up to an hour"
        ))),
    }
}

fn percent_decode(value: &str) -> Result<String, LockError> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| bad("a bad percent-escape in an option"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad("an option is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_parse() {
        let p = parse("redlock://127.0.0.1:7001,127.0.0.1:7002,localhost").unwrap();
        assert_eq!(
            p.instances,
            [
                "redis://127.0.0.1:7001/",
                "redis://127.0.0.1:7002/",
                "redis://localhost:6379/"
            ]
        );
        let p = parse(
            "redlock://u:p%40ss@h1:1,h2:2,x:y@h3:3/4?prefix=app%3A&timeout=50ms&fencing=false",
        )
        .unwrap();
        assert_eq!(
            p.instances,
            [
                "redis://u:p%40ss@h1:1/4",
                "redis://u:p%40ss@h2:2/4",
                "redis://x:y@h3:3/4"
            ]
        );
        assert_eq!(p.prefix.as_deref(), Some("app:"));
        assert_eq!(p.instance_timeout, Some(Duration::from_millis(50)));
        assert_eq!(p.fencing, Some(false));
        let p = parse("redlocks://[::1]:7000,h:7001?connect_timeout=1.5s").unwrap();
        assert_eq!(p.instances, ["rediss://[::1]:7000/", "rediss://h:7001/"]);
        assert_eq!(p.connect_timeout, Some(Duration::from_millis(1500)));
        let p = parse("redlock://h1,h2,h3?tls=true").unwrap();
        assert!(p.instances.iter().all(|i| i.starts_with("rediss://")));
    }

    #[test]
    fn malformed_urls_are_config_errors() {
        for url in [
            "",
            "redis://h:1",
            "redlock://",
            "redlock://h1,,h2",
            "redlock://h1,h2:",
            "redlock://h1:notaport",
            "redlock://h1:70000",
            "redlock://h1/notadb",
            "redlock://h1?timeout=5",
            "redlock://h1?timeout=-1s",
            "redlock://h1?bogus=1",
            "redlock://h1?tls=maybe",
            "redlock://h1#frag",
            "redlock://[::1,h2",
            "redlock://h 1",
            "redlock://@h1",
        ] {
            match parse(url) {
                Err(LockError::Config { .. }) => {}
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn errors_never_show_passwords() {
        for url in [
            "redlock://u:s3cret@h1:notaport",
            "redlock://u:s3cret@h1,h2?bogus=1",
            "redlock://u:s3cret@h1/x",
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{e}");
        }
        let p = parse("redlock://u:s3cret@h1").unwrap();
        assert!(!format!("{p:?}").contains("s3cret"));
    }
}
