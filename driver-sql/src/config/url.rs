//! Database URLs, parsed once with [`lockcore::store_url`]: the options each database
//! knows (others are refused with the list), `distlock_table`, and the password kept as a
//! secret. sqlx gets the URL without its secrets (nothing it reports or logs can quote
//! them) and the password through its options' setter.

#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

#[cfg(any(feature = "postgres", feature = "mysql"))]
use lockcore::store_url::ExposeSecret;
use lockcore::store_url::StoreUrl;
use lockcore::LockError;
#[cfg(feature = "mysql")]
use sqlx::mysql::MySqlConnectOptions;
#[cfg(feature = "postgres")]
use sqlx::postgres::PgConnectOptions;
#[cfg(feature = "sqlite")]
use sqlx::sqlite::SqliteConnectOptions;

use crate::config::{SqlOptions, TableName};

/// The query option that picks the lock table; read here, never passed to the database.
pub(crate) const TABLE_OPTION: &str = "distlock_table";

/// The options of `postgres://` URLs: sqlx's (libpq's names and their aliases), the
/// credentials, and `distlock_table`.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const POSTGRES_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "options[",
    TABLE_OPTION,
];

/// The options of `mysql://` and `mariadb://` URLs.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) const MYSQL_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
    "user",
    "password",
    TABLE_OPTION,
];

/// The options of `sqlite:` URLs.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) const SQLITE_OPTIONS: &[&str] = &["mode", "cache", "immutable", "vfs", TABLE_OPTION];

/// Parses `url` for a database whose schemes are `schemes`, checks its options against
/// `known`, and applies `distlock_table` to `options`.
pub(crate) fn parse(
    url: &str,
    schemes: &[&str],
    known: &[&str],
    options: SqlOptions,
) -> Result<(StoreUrl, SqlOptions), LockError> {
    let url = StoreUrl::parse(url)?;
    if !schemes.contains(&url.scheme()) {
        return Err(LockError::config(format!(
            "a {} URL was expected, not {}:",
            schemes.join(":/"),
            url.scheme()
        )));
    }
    url.check_options(known, &["options"])?;
    // Credentials given twice (userinfo and option) are refused before anything connects.
    url.user()?;
    url.password()?;
    if url.fragment().is_some() {
        return Err(url.error("a database URL has no #fragment"));
    }
    let options = match url.str_option(TABLE_OPTION)? {
        Some(name) => options.table_name_value(TableName::new(name)?),
        None => options,
    };
    Ok((url, options))
}

/// What sqlx may see of `url`: no secrets, no `distlock_` options, `scheme` as sqlx names it.
fn public(url: &StoreUrl, scheme: &str) -> String {
    let text = url.without_secrets(&[TABLE_OPTION, "password", "user"]);
    match text.split_once(':') {
        Some((_, rest)) => format!("{scheme}:{rest}"),
        None => text,
    }
}

/// What one database's URLs look like.
struct Database {
    /// The schemes it answers to, the one sqlx knows first.
    schemes: &'static [&'static str],
    /// The options it knows.
    known: &'static [&'static str],
    /// Its name in errors.
    name: &'static str,
}

/// `url` parsed for `db`: the connect options sqlx reads from it (secrets withheld), and
/// `options` with the URL's table.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn connect_options<C>(
    url: &str,
    db: &Database,
    options: SqlOptions,
) -> Result<(StoreUrl, C, SqlOptions), LockError>
where
    C: std::str::FromStr,
    C::Err: std::fmt::Display,
{
    let (url, options) = parse(url, db.schemes, db.known, options)?;
    let connect = C::from_str(&public(&url, db.schemes[0]))
        .map_err(|e| url.error(format_args!("invalid {} URL: {e}", db.name)))?;
    Ok((url, connect, options))
}

/// The connect options of a database server's URL, with the user and password handed to
/// sqlx through its options' setters `user` and `password`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn server_options<C>(
    url: &str,
    db: &Database,
    options: SqlOptions,
    user: fn(C, &str) -> C,
    password: fn(C, &str) -> C,
) -> Result<(C, SqlOptions), LockError>
where
    C: std::str::FromStr,
    C::Err: std::fmt::Display,
{
    let (url, mut connect, options) = connect_options::<C>(url, db, options)?;
    if let Some(name) = url.user()? {
        connect = user(connect, &name);
    }
    if let Some(secret) = url.password()? {
        connect = password(connect, secret.expose_secret());
    }
    Ok((connect, options))
}

/// Connect options for sqlx, and the options with the URL's table.
type Connect<C> = Result<(C, SqlOptions), LockError>;

/// The connect options of a `postgres://` or `postgresql://` URL.
#[cfg(feature = "postgres")]
pub(crate) fn postgres(url: &str, options: SqlOptions) -> Connect<PgConnectOptions> {
    let (user, password) = (PgConnectOptions::username, PgConnectOptions::password);
    let db = Database {
        schemes: &["postgres", "postgresql"],
        known: POSTGRES_OPTIONS,
        name: "PostgreSQL",
    };
    server_options(url, &db, options, user, password)
}

/// The connect options of a `mysql://` or `mariadb://` URL.
#[cfg(feature = "mysql")]
pub(crate) fn mysql(url: &str, options: SqlOptions) -> Connect<MySqlConnectOptions> {
    use MySqlConnectOptions as O;
    let db = Database {
        schemes: &["mysql", "mariadb"],
        known: MYSQL_OPTIONS,
        name: "MySQL",
    };
    server_options(url, &db, options, O::username, O::password)
}

/// The connect options of a `sqlite:` URL.
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite(url: &str, options: SqlOptions) -> Connect<SqliteConnectOptions> {
    let db = Database {
        schemes: &["sqlite"],
        known: SQLITE_OPTIONS,
        name: "SQLite",
    };
    let (_, connect, options) = connect_options(url, &db, options)?;
    Ok((connect, options))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_the_table_taken() {
        let (url, o) = parse(
            "postgres://u:pw@h/db?sslmode=require&distlock_table=x",
            &["postgres"],
            POSTGRES_OPTIONS,
            SqlOptions::new(),
        )
        .unwrap();
        assert_eq!(o.table_name().as_str(), "x");
        assert_eq!(
            public(&url, "postgres"),
            "postgres://u@h/db?sslmode=require"
        );
        let (url, o) = parse(
            "sqlite:/tmp/a.db?distlock_table=y",
            &["sqlite"],
            SQLITE_OPTIONS,
            SqlOptions::new(),
        )
        .unwrap();
        assert_eq!(o.table_name().as_str(), "y");
        assert_eq!(public(&url, "sqlite"), "sqlite:/tmp/a.db");
        // There is no arrival-order layout: the option is refused, by name.
        for (url, schemes, known) in [
            (
                "sqlite:a?distlock_fair=true",
                &["sqlite"][..],
                SQLITE_OPTIONS,
            ),
            (
                "postgres://h/db?distlock_fair=true",
                &["postgres"],
                POSTGRES_OPTIONS,
            ),
            ("mysql://h/db?distlock_fair=true", &["mysql"], MYSQL_OPTIONS),
        ] {
            let err = parse(url, schemes, known, SqlOptions::new())
                .map(|_| ())
                .unwrap_err();
            assert!(matches!(err, LockError::Config { .. }), "{url}");
            assert!(
                err.to_string().contains("unknown option \"distlock_fair\""),
                "{url}: {err}"
            );
        }
        for (bad, schemes, known) in [
            (
                "sqlite:a?distlock_table=a;b",
                &["sqlite"][..],
                SQLITE_OPTIONS,
            ),
            ("sqlite:a?password=s3cret", &["sqlite"], SQLITE_OPTIONS),
            (
                "postgres://h/db?sslpassword=s3cret",
                &["postgres"],
                POSTGRES_OPTIONS,
            ),
            (
                "postgres://h/db?ssl_mode=require&password=s3cret",
                &["postgres"],
                POSTGRES_OPTIONS,
            ),
            ("mysql://h/db?pass=s3cret", &["mysql"], MYSQL_OPTIONS),
            (
                "mysql://u:s3cret@h/db?password=other",
                &["mysql"],
                MYSQL_OPTIONS,
            ),
        ] {
            let e = parse(bad, schemes, known, SqlOptions::new())
                .map(|_| ())
                .unwrap_err();
            assert!(matches!(e, LockError::Config { .. }), "{bad}");
            assert!(!e.to_string().contains("s3cret"), "{bad}: {e}");
        }
        let e = parse(
            "postgres://h/db?sslpassword=s3cret",
            &["postgres"],
            POSTGRES_OPTIONS,
            SqlOptions::new(),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("sslpassword") && e.contains("known: sslmode"),
            "{e}"
        );
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mariadb_urls_reach_sqlx_as_mysql_with_the_password_set_apart() {
        let (connect, _) = mysql(
            "mariadb://app@h:3307/db?password=s%26cret",
            SqlOptions::new(),
        )
        .unwrap();
        assert_eq!(connect.get_port(), 3307);
        assert_eq!(connect.get_username(), "app");
    }
}
