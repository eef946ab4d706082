//! Guessing the scheme a `host:port` without one probably meant.

use super::url::redact;

/// The usual port of each store, for guessing a forgotten scheme.
const PORT_SCHEMES: &[(u16, &str)] = &[
    (6379, "redis"),
    (6380, "rediss"),
    (5432, "postgres"),
    (3306, "mysql"),
    (2379, "etcd"),
    (2181, "zk"),
];

/// For text that looks like `host:port` or `host` without a scheme (`localhost:6379`,
/// `127.0.0.1:5432`, `db.example:2379`), the URL it probably meant, guessed from the port
/// (`redis://localhost:6379`); `None` when the port is not a store's usual one or the text
/// does not look like a host.
///
/// # Examples
///
/// ```
/// use distlock_core::store_url::guess_missing_scheme;
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
