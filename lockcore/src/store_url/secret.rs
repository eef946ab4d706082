//! What counts as a secret in a URL, and what stands for it when the URL is shown.

use super::syntax::scheme_of;

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
/// use distlock_core::store_url::is_secret_key;
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

/// `url`, which did not parse, with every part that may be a secret replaced by `***`,
/// found without a parse:
///
/// * the values of secret options (after a `?` or `&`, in any place: a password may hold
///   an unencoded `?`);
/// * in the authority, from the first `:` up to the URL's last `@`: a password, even one
///   holding an unencoded `@`, `/`, `?`, `,` or `#`, with whatever else lies there (a port
///   or another host's user name: hiding those is safe).
///
/// Control characters are escaped: the text is the user's and may reach a terminal.
pub(super) fn redact_unparsed(url: &str) -> String {
    let url = redact_option_values(url);
    // Only a scheme followed by `//` is skipped: in `u:pw@host` the first `:` is a
    // password's.
    let start = scheme_of(&url)
        .map(|s| s.len() + 1)
        .filter(|&end| url[end..].starts_with("//"))
        .map_or(0, |end| end + 2);
    let hidden = url.rfind('@').filter(|&at| at > start).and_then(|at| {
        let colon = start + url[start..at].find(':')?;
        Some(colon + 1..at)
    });
    match hidden {
        Some(range) => escape_controls(&format!(
            "{}{REDACTED}{}",
            &url[..range.start],
            &url[range.end..]
        )),
        None => escape_controls(&url),
    }
}

/// `url` with the value of every `key=value` after a `?` or `&` whose key
/// [is a secret's](is_secret_key) replaced by `***`.
fn redact_option_values(url: &str) -> String {
    let Some(query) = url.find('?') else {
        return url.to_owned();
    };
    let mut out = url[..query].to_owned();
    let mut rest = &url[query..];
    while let Some(sep) = rest.chars().next() {
        out.push(sep);
        let body = &rest[1..];
        let end = body.find(['?', '&']).unwrap_or(body.len());
        let pair = &body[..end];
        match pair.split_once('=') {
            Some((key, value)) if is_secret_key(key) && !value.is_empty() => {
                out.push_str(key);
                out.push('=');
                out.push_str(REDACTED);
            }
            _ => out.push_str(pair),
        }
        rest = &body[end..];
    }
    out
}

/// `text` with its control characters escaped (`\u{1b}`, `\n`), so that it cannot move
/// the cursor or rewrite a line when shown.
pub(super) fn escape_controls(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
