//! The `redlock://` URL: a host list the `url` crate cannot parse, so we parse it here.
//!
//! ```text
//! redlock://[user[:password]@]host[:port][,[user[:password]@]host[:port]…][/db][?option=value&…]
//! redlocks://…                      (every instance over TLS, like rediss://)
//! ```
//!
//! Credentials on the first entry apply to every entry that carries none of its own; an
//! entry with its own credentials uses those. The password may also be given as
//! `?password=…` (for every instance without credentials of its own). Passwords are
//! percent-decoded once, here, and kept as secrets from then on. The port defaults to
//! 6379. Options (the grammar of [`lockcore::store_url`]): `prefix`, `timeout` (the
//! per-instance timeout, e.g. `50ms`, `1s`), `connect_timeout`, `tls` (boolean),
//! `fencing` (boolean), `user`, `password`.

use std::time::Duration;

use lockcore::store_url::{Credentials, StoreUrl};
use lockcore::LockError;

/// What a `redlock://` URL says.
#[derive(Clone, Debug)]
pub(crate) struct ParsedUrl {
    /// One `redis://` or `rediss://` URL per instance (`Debug` shows them redacted).
    pub(crate) instances: Vec<StoreUrl>,
    pub(crate) prefix: Option<String>,
    pub(crate) instance_timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) fencing: Option<bool>,
}

/// The options a `redlock://` URL takes.
const KNOWN_OPTIONS: &[&str] = &[
    "prefix",
    "timeout",
    "connect_timeout",
    "tls",
    "fencing",
    "user",
    "password",
];

const SYNTAX: &str =
    "expected redlock://[user:password@]host:port,host:port,host:port[/db][?prefix=…&timeout=…]";

fn bad(what: impl std::fmt::Display) -> LockError {
    LockError::config(format!("malformed redlock URL: {what}; {SYNTAX}"))
}

/// Parses a `redlock://` or `redlocks://` URL. Errors never echo a password.
pub(crate) fn parse(url: &str) -> Result<ParsedUrl, LockError> {
    let url = StoreUrl::parse(url)?;
    let mut tls = match url.scheme() {
        "redlock" => false,
        "redlocks" => true,
        other => {
            return Err(bad(format_args!(
                "the scheme must be redlock:// or redlocks://, not {other:?}"
            )))
        }
    };
    url.check_options(KNOWN_OPTIONS, &[])?;
    if url.fragment().is_some() {
        return Err(bad("a fragment (#…) is not allowed"));
    }
    let db = url.decoded_path()?;
    if !db.is_empty() && (!db.bytes().all(|b| b.is_ascii_digit()) || db.parse::<u32>().is_err()) {
        return Err(bad("the database (the path) is not a number"));
    }
    if let Some(t) = url.bool_option("tls")? {
        tls = t;
    }
    let duration = |key: &str| -> Result<Option<Duration>, LockError> {
        match url.duration_option(key)? {
            Some(d) if d.is_zero() || d > Duration::from_secs(3600) => Err(bad(format_args!(
                "{key} must be above zero and at most an hour"
            ))),
            other => Ok(other),
        }
    };
    let mut parsed = ParsedUrl {
        instances: Vec::new(),
        prefix: url.str_option("prefix")?.map(str::to_owned),
        instance_timeout: duration("timeout")?,
        connect_timeout: duration("connect_timeout")?,
        fencing: url.bool_option("fencing")?,
    };
    if url.endpoints().is_empty() {
        return Err(bad("no instances"));
    }
    // Credentials for the instances without their own: the first instance's, else the
    // `user`/`password` options.
    let first = url.endpoints()[0].credentials.clone();
    let from_options = match (url.str_option("user")?, url.secret_option("password")?) {
        (user, Some(password)) if first.is_none() => Some(Credentials {
            user: user.unwrap_or_default().to_owned(),
            password: Some(password),
        }),
        (Some(user), None) if first.is_none() => Some(Credentials {
            user: user.to_owned(),
            password: None,
        }),
        (None, None) => None,
        _ => {
            return Err(bad(
                "credentials are given both before '@' and as ?user=/?password=; keep one",
            ))
        }
    };
    let default_credentials = first.or(from_options);
    let scheme = if tls { "rediss" } else { "redis" };
    let path = if db.is_empty() {
        "/".to_owned()
    } else {
        format!("/{db}")
    };
    for (i, endpoint) in url.endpoints().iter().enumerate() {
        if endpoint.host.is_empty() {
            return Err(bad(format_args!("instance {} names no host", i + 1)));
        }
        let mut endpoint = endpoint.clone();
        if endpoint.credentials.is_none() {
            endpoint.credentials = default_credentials.clone();
        }
        endpoint.port = Some(endpoint.port.unwrap_or(6379));
        parsed
            .instances
            .push(StoreUrl::for_endpoint(scheme, endpoint, &path));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::store_url::ExposeSecret;

    fn shown(p: &ParsedUrl) -> Vec<String> {
        p.instances.iter().map(|i| i.to_string()).collect()
    }

    fn passwords(p: &ParsedUrl) -> Vec<Option<String>> {
        p.instances
            .iter()
            .map(|i| i.password().unwrap().map(|s| s.expose_secret().to_owned()))
            .collect()
    }

    #[test]
    fn host_lists_parse() {
        let p = parse("redlock://127.0.0.1:7001,127.0.0.1:7002,localhost").unwrap();
        assert_eq!(
            shown(&p),
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
            shown(&p),
            [
                "redis://u:***@h1:1/4",
                "redis://u:***@h2:2/4",
                "redis://x:***@h3:3/4"
            ]
        );
        assert_eq!(
            passwords(&p),
            [Some("p@ss".into()), Some("p@ss".into()), Some("y".into())]
        );
        assert_eq!(p.prefix.as_deref(), Some("app:"));
        assert_eq!(p.instance_timeout, Some(Duration::from_millis(50)));
        assert_eq!(p.fencing, Some(false));
        let p = parse("redlocks://[::1]:7000,h:7001?connect_timeout=1.5s").unwrap();
        assert_eq!(shown(&p), ["rediss://[::1]:7000/", "rediss://h:7001/"]);
        assert_eq!(p.connect_timeout, Some(Duration::from_millis(1500)));
        let p = parse("redlock://h1,h2,h3?tls=true").unwrap();
        assert!(shown(&p).iter().all(|i| i.starts_with("rediss://")));
        let p = parse("redlock://h1,h2?password=lock&prefix=lock:").unwrap();
        assert_eq!(
            shown(&p),
            ["redis://:***@h1:6379/", "redis://:***@h2:6379/"]
        );
        assert_eq!(passwords(&p), [Some("lock".into()), Some("lock".into())]);
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
            "redlock://h1?timeout=2h",
            "redlock://u:p@h1?password=q",
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
        let e = parse("redlock://h1?timeout=5").unwrap_err().to_string();
        assert!(e.contains("write 500ms or 5s"), "{e}");
    }
}
