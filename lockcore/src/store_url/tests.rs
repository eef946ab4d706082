use std::time::Duration;

use super::*;
use crate::LockError;

/// Every scheme, every place a secret can be written: the URL parses, the secret is read
/// back exactly, and neither the redacted text, `Debug`, nor `Display` shows it — also when
/// the secret is a common word that appears elsewhere in the URL ("lock", "redis").
#[test]
fn every_scheme_and_secret_placement_is_redacted() {
    // (url, the secret it carries, the URL as it must be shown)
    let table: &[(&str, &str, &str)] = &[
        // userinfo
        (
            "redis://u:s3cret@h:6379/0",
            "s3cret",
            "redis://u:***@h:6379/0",
        ),
        ("redis://:s3cret@h", "s3cret", "redis://:***@h"),
        (
            "rediss://default:s3cret@h:6380/1",
            "s3cret",
            "rediss://default:***@h:6380/1",
        ),
        (
            "redlock://u:s3cret@h1:1,h2:2,h3",
            "s3cret",
            "redlock://u:***@h1:1,h2:2,h3",
        ),
        (
            "redlocks://h1,x:s3cret@h2",
            "s3cret",
            "redlocks://h1,x:***@h2",
        ),
        (
            "postgres://u:s3cret@db:5432/app",
            "s3cret",
            "postgres://u:***@db:5432/app",
        ),
        (
            "postgresql://u:s3cret@db/app?sslmode=require",
            "s3cret",
            "postgresql://u:***@db/app?sslmode=require",
        ),
        ("mysql://u:s3cret@db/app", "s3cret", "mysql://u:***@db/app"),
        (
            "mariadb://u:s3cret@[::1]:3306/app",
            "s3cret",
            "mariadb://u:***@[::1]:3306/app",
        ),
        (
            "etcd://u:s3cret@e1,e2:2479/ns",
            "s3cret",
            "etcd://u:***@e1,e2:2479/ns",
        ),
        (
            "etcds://u:s3cret@e1/ns?ca=/ca.pem",
            "s3cret",
            "etcds://u:***@e1/ns?ca=/ca.pem",
        ),
        // query keys
        (
            "redis+unix:///run/r.sock?db=1&pass=s3cret",
            "s3cret",
            "redis+unix:///run/r.sock?db=1&pass=***",
        ),
        (
            "redis://h/0?password=s3cret",
            "s3cret",
            "redis://h/0?password=***",
        ),
        (
            "redlock://h1,h2,h3?password=s3cret&prefix=a:",
            "s3cret",
            "redlock://h1,h2,h3?password=***&prefix=a:",
        ),
        (
            "postgres://u@db/app?password=s3cret",
            "s3cret",
            "postgres://u@db/app?password=***",
        ),
        (
            "postgres://u@db/app?sslmode=verify-full&sslpassword=s3cret",
            "s3cret",
            "postgres://u@db/app?sslmode=verify-full&sslpassword=***",
        ),
        (
            "mysql://u@db/app?ssl-mode=REQUIRED&password=s3cret",
            "s3cret",
            "mysql://u@db/app?ssl-mode=REQUIRED&password=***",
        ),
        (
            "etcd://e1?user=u&password=s3cret",
            "s3cret",
            "etcd://e1?user=u&password=***",
        ),
        ("etcd://e1?token=s3cret", "s3cret", "etcd://e1?token=***"),
        (
            "sqlite:/tmp/locks.db?api_key=s3cret",
            "s3cret",
            "sqlite:/tmp/locks.db?api_key=***",
        ),
        (
            "memory:name?Secret=s3cret",
            "s3cret",
            "memory:name?Secret=***",
        ),
        // percent-encoded secrets: hidden as written, read back decoded
        ("redis://u:s%40cr%3Aet@h", "s@cr:et", "redis://u:***@h"),
        (
            "postgres://u@db/app?password=s%26cr%3Det+x",
            "s&cr=et x",
            "postgres://u@db/app?password=***",
        ),
        // a repeated key: every occurrence is hidden (the last one is the value)
        (
            "mysql://u@db/app?password=first&password=s3cret",
            "s3cret",
            "mysql://u@db/app?password=***&password=***",
        ),
        // secrets that are common words, also present elsewhere in the URL
        (
            "redis://lock:lock@lock-host:6379/0?prefix=lock",
            "lock",
            "redis://lock:***@lock-host:6379/0?prefix=lock",
        ),
        (
            "redis://redis:redis@redis/0",
            "redis",
            "redis://redis:***@redis/0",
        ),
        (
            "postgres://postgres@postgres/postgres?password=postgres",
            "postgres",
            "postgres://postgres@postgres/postgres?password=***",
        ),
        (
            "etcd://etcd:etcd@etcd:2379/etcd",
            "etcd",
            "etcd://etcd:***@etcd:2379/etcd",
        ),
    ];
    for (url, secret, shown) in table {
        let parsed = StoreUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(redact(url), *shown, "{url}");
        assert_eq!(parsed.to_string(), *shown, "{url}");
        assert_eq!(
            format!("{parsed:?}"),
            format!("StoreUrl({shown:?})"),
            "{url}"
        );
        let found = parsed
            .password()
            .ok()
            .flatten()
            .or_else(|| parsed.secret_option("token").ok().flatten())
            .or_else(|| parsed.secret_option("sslpassword").ok().flatten())
            .or_else(|| parsed.secret_option("api_key").ok().flatten())
            .or_else(|| parsed.secret_option("Secret").ok().flatten())
            .or_else(|| {
                parsed
                    .endpoints()
                    .iter()
                    .find_map(|e| e.credentials.as_ref()?.password.clone())
            });
        assert_eq!(
            found.as_ref().map(|s| s.expose_secret()),
            Some(*secret),
            "{url}"
        );
        for e in parsed.endpoints() {
            assert!(
                !format!("{e:?}").contains(secret)
                    || e.host.contains(secret)
                    || e.credentials
                        .as_ref()
                        .is_some_and(|c| c.user.contains(secret)),
                "{url}: {e:?}"
            );
        }
        if !["lock", "redis", "postgres", "etcd"].contains(secret) {
            assert!(!parsed.without_secrets(&[]).contains(secret), "{url}");
        }
    }
}

#[test]
fn hosts_ports_paths_and_options() {
    let u = StoreUrl::parse(
        "REDLOCK://a:p@h1:7001,[::1],h-3.example:7003/2?prefix=app%3A&timeout=50ms",
    )
    .unwrap();
    assert_eq!(u.scheme(), "redlock");
    let hosts: Vec<String> = u.endpoints().iter().map(|e| e.host_port(6379)).collect();
    assert_eq!(hosts, ["h1:7001", "[::1]:6379", "h-3.example:7003"]);
    assert_eq!(u.path(), "/2");
    assert_eq!(u.decoded_path().unwrap(), "2");
    assert_eq!(u.str_option("prefix").unwrap(), Some("app:"));
    assert_eq!(
        u.duration_option("timeout").unwrap(),
        Some(Duration::from_millis(50))
    );
    assert_eq!(u.user().unwrap().as_deref(), Some("a"));

    let s = StoreUrl::parse("sqlite:/tmp/x y.db?mode=rwc").unwrap();
    assert!(s.endpoints().is_empty());
    assert_eq!(s.path(), "/tmp/x y.db");
    let s = StoreUrl::parse("sqlite://relative/locks.db").unwrap();
    assert_eq!(s.path(), "relative/locks.db");
    let s = StoreUrl::parse("sqlite::memory:").unwrap();
    assert_eq!(s.path(), ":memory:");
    assert_eq!(StoreUrl::parse("memory:").unwrap().path(), "");
    assert_eq!(
        StoreUrl::parse("memory://shared")
            .unwrap()
            .decoded_path()
            .unwrap(),
        "shared"
    );
    let r = StoreUrl::parse("rediss://h/0#insecure").unwrap();
    assert_eq!(r.fragment(), Some("insecure"));
    let p = StoreUrl::parse("postgres://u@/db?host=/run/postgresql").unwrap();
    assert_eq!(p.endpoints()[0].host, "");
    assert!(p.single_endpoint().is_err());
    assert!(StoreUrl::parse("redis://a,b")
        .unwrap()
        .single_endpoint()
        .is_err());
}

#[test]
fn without_secrets_keeps_everything_else() {
    let u = StoreUrl::parse("postgres://ops%40corp:pw@db:5432/app?sslmode=require&password=x&distlock_table=t&application_name=a+b").unwrap();
    assert_eq!(
        u.without_secrets(&["distlock_table"]),
        "postgres://ops%40corp@db:5432/app?sslmode=require&application_name=a%20b"
    );
    let u = StoreUrl::parse("redis://:pw@h/0#insecure").unwrap();
    assert_eq!(u.without_secrets(&[]), "redis://h/0#insecure");
    let one = StoreUrl::for_endpoint("rediss", u.endpoints()[0].clone(), "/3");
    assert_eq!(one.to_string(), "rediss://:***@h/3");
    assert_eq!(one.password().unwrap().unwrap().expose_secret(), "pw");
}

#[test]
fn one_grammar_for_booleans_and_durations() {
    for (v, b) in [
        ("true", true),
        ("TRUE", true),
        ("1", true),
        ("yes", true),
        ("On", true),
        ("false", false),
        ("0", false),
        ("NO", false),
        ("off", false),
    ] {
        assert_eq!(parse_bool(v), Ok(b), "{v}");
    }
    assert!(parse_bool("").is_err() && parse_bool("2").is_err());
    for (v, d) in [
        ("500ms", 500),
        ("5s", 5000),
        ("1.5s", 1500),
        ("5m", 300_000),
        ("1m 30s", 90_000),
    ] {
        assert_eq!(parse_duration(v), Ok(Duration::from_millis(d)), "{v}");
    }
    for bare in ["5", "500", "1.5"] {
        let e = parse_duration(bare).unwrap_err();
        assert!(e.contains("write 500ms or 5s"), "{e}");
    }
    assert!(parse_duration("soon").unwrap_err().contains("500ms"));
    let u = StoreUrl::parse("etcd://h?fair&tls=off&timeout=5").unwrap();
    assert_eq!(u.bool_option("fair").unwrap(), Some(true));
    assert_eq!(u.bool_option("tls").unwrap(), Some(false));
    let e = u.duration_option("timeout").unwrap_err().to_string();
    assert!(
        e.contains("timeout") && e.contains("write 500ms or 5s"),
        "{e}"
    );
}

#[test]
fn unknown_and_repeated_options_are_refused_with_the_known_list() {
    let u = StoreUrl::parse("redis://h?prefx=a&password=s3cret").unwrap();
    let e = u
        .check_options(&["prefix", "password"], &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"prefx\"") && e.contains("known: prefix, password"),
        "{e}"
    );
    let u = StoreUrl::parse("postgres://h/db?sslpassword=s3cret").unwrap();
    let e = u.check_options(&["sslmode"], &[]).unwrap_err().to_string();
    assert!(e.contains("sslpassword") && !e.contains("s3cret"), "{e}");
    let u = StoreUrl::parse("postgres://h/db?options=-c%20a&options=-c%20b&options[x]=1").unwrap();
    assert!(u
        .check_options(&["options", "options["], &["options"])
        .is_ok());
    assert!(u.check_options(&["options", "options["], &[]).is_err());
    let u = StoreUrl::parse("redis://u:a@h?password=b").unwrap();
    assert!(u.password().is_err());
}

#[test]
fn malformed_urls_are_refused_without_echoing_secrets() {
    for url in [
        "",
        "no-scheme-here",
        "127.0.0.1:6379",
        "redis://h:notaport",
        "redis://h:0",
        "redis://h:70000",
        "redis://u:s3cret@h:x",
        "redlock://h1,,h2",
        "redlock://[::1,h2",
        "etcd://@h",
        "etcd://u:%zz@h",
        "etcd://u:s3cret%zz@h",
        "redis://h 1",
        "postgres://u@h/db?password=s3cret%zz",
        "redis://u:s3cret/x@h",
    ] {
        let e = StoreUrl::parse(url)
            .err()
            .unwrap_or_else(|| panic!("{url} parsed"));
        assert!(matches!(e, LockError::Config { .. }), "{url}");
        assert!(!e.to_string().contains("s3cret"), "{url}: {e}");
        let shown = redact(url);
        assert!(!shown.contains("s3cret"), "{url}: {shown}");
    }
}

/// A URL that does not parse is shown as typed, but for what may be a secret: passwords
/// however they are written, and secret options wherever they are.
#[test]
fn malformed_urls_are_shown_without_their_secrets() {
    for (url, shown) in [
        ("redis://h:notaport", "redis://h:notaport"),
        ("redis://u:s3cret@h:x", "redis://u:***@h:x"),
        ("redis://:s3cret@h:x", "redis://:***@h:x"),
        ("redis://u:s3/cr@t@h:x", "redis://u:***@h:x"),
        ("redis://u:s3?cret@h:x", "redis://u:***@h:x"),
        ("redlock://u:s3cret@a:1,u:s3cret@b:x", "redlock://u:***@b:x"),
        ("etcd://u:s3cret%zz@h", "etcd://u:***@h"),
        (
            "postgres://u@h:1/db?sslmode=x&password=s3cret%zz",
            "postgres://u@h:1/db?sslmode=x&password=***",
        ),
        (
            "redis://h/?x=1?pass=s3cret&y=%zz",
            "redis://h/?x=1?pass=***&y=%zz",
        ),
        ("u:s3cret@h:x", "u:***@h:x"),
        ("u:s3cret@h:6379", "u:***@h:6379"),
        ("redis:u:s3cret@h", "redis:***@h"),
        ("redis://h:1\x1b[2J/", "redis://h:1\\u{1b}[2J/"),
        ("", ""),
    ] {
        let url = url.replace("\\x1b", "\x1b");
        assert_eq!(redact(&url), shown, "{url:?}");
    }
}

/// Errors name a host by its text where that cannot be a password, else by its place.
#[test]
fn malformed_hosts_are_named_by_text_or_place() {
    for (url, says) in [
        (
            "redis://127.0.0.1:abc/",
            "the port of host '127.0.0.1:abc' is not a number",
        ),
        ("redis://127.0.0.1:/", "host '127.0.0.1:' has an empty port"),
        ("redis://u:p@h:99999/", "the port of host 'h:99999'"),
        ("redlock://a:1,b:2,c:0", "the port of host 'c:0'"),
        ("redlock://a:1,,b:2", "the second host is empty"),
        ("redis://[::1/", "host '[::1': unclosed '['"),
        // A password with an unencoded '/' ends the authority inside it: its text is not
        // quoted.
        ("redis://u:s3c/ret@h/", "the port of the first host"),
    ] {
        let e = StoreUrl::parse(url)
            .err()
            .unwrap_or_else(|| panic!("{url} parsed"))
            .to_string();
        assert!(e.contains(says), "{url}: {e}");
        assert!(!e.contains("s3c"), "{url}: {e}");
    }
}

#[test]
fn forgotten_schemes_are_guessed_by_port() {
    for (text, guess) in [
        ("localhost:6379", Some("redis://localhost:6379")),
        ("127.0.0.1:5432", Some("postgres://127.0.0.1:5432")),
        ("db.example:3306/app", Some("mysql://db.example:3306/app")),
        ("db.example:2379", Some("etcd://db.example:2379")),
        (
            "u:s3cret@localhost:6379/0",
            Some("redis://u:***@localhost:6379/0"),
        ),
        (
            "localhost:5432/db?password=s3cret",
            Some("postgres://localhost:5432/db?password=***"),
        ),
        ("db.example:1234", None),
        ("redis://localhost:6379", None),
        ("sqlite:locks.db", None),
    ] {
        assert_eq!(guess_missing_scheme(text).as_deref(), guess, "{text}");
    }
    assert!(looks_like_host_port("db.example:1234"));
    assert!(!looks_like_host_port("memory:"));
}
