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
//! use distlock_core::store_url::{redact, ExposeSecret, StoreUrl};
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

mod endpoint;
mod guess;
mod options;
mod secret;
mod syntax;
mod url;

pub use endpoint::{Credentials, Endpoint};
pub use guess::{guess_missing_scheme, looks_like_host_port};
pub use options::{parse_bool, parse_duration};
pub use secrecy::{ExposeSecret, SecretString};
pub use secret::{is_secret_key, REDACTED};
pub use url::{redact, StoreUrl, PATH_SCHEMES};

#[cfg(test)]
mod tests;
