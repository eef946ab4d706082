//! What counts as a secret in a URL, and what stands for it when the URL is shown.

/// The text that stands for a secret in redacted URLs and `Debug` output.
pub const REDACTED: &str = "***";

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
