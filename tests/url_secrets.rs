//! What the `distlock` command prints about a store URL that carries a secret: the URL
//! redacted by parsing (userinfo password and secret options as `***`), never the secret,
//! and never a word of the message mangled because it equals the password.
#![cfg(feature = "cli")]

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn run(url: &str) -> (Output, String) {
    let out = Command::new(BIN)
        .args(["--url", url, "status", "k"])
        .env_remove("DISTLOCK_URL")
        .output()
        .expect("distlock runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

/// A closed loopback port, so every scheme fails fast whether or not its feature is built in.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn query_passwords_are_redacted_in_cli_errors() {
    let port = dead_port();
    for (url, shown) in [
        (
            format!("postgres://app@127.0.0.1:{port}/db?password=hunter2-s3cret"),
            format!("postgres://app@127.0.0.1:{port}/db?password=***"),
        ),
        (
            format!("mysql://app@127.0.0.1:{port}/db?ssl-mode=DISABLED&password=hunter2-s3cret"),
            format!("mysql://app@127.0.0.1:{port}/db?ssl-mode=DISABLED&password=***"),
        ),
        (
            format!("redis://127.0.0.1:{port}/0?password=hunter2-s3cret"),
            format!("redis://127.0.0.1:{port}/0?password=***"),
        ),
        (
            // etcd connects lazily: the failure comes with the first operation and names
            // the endpoint, not the URL.
            format!("etcd://127.0.0.1:{port}?user=app&password=hunter2-s3cret&timeout=300ms"),
            format!("etcd at 127.0.0.1:{port} is unavailable while inspecting \"k\": connection refused"),
        ),
        (
            format!("redis+cluster://127.0.0.1:{port},127.0.0.1:{port}/?password=hunter2-s3cret"),
            format!("redis+cluster://127.0.0.1:{port},127.0.0.1:{port}/?password=***"),
        ),
        (
            format!("redis+sentinel://app:hunter2-s3cret@127.0.0.1:{port}/mymaster?sentinel_password=hunter2-s3cret"),
            format!("redis+sentinel://app:***@127.0.0.1:{port}/mymaster?sentinel_password=***"),
        ),
        (
            format!("redlock://127.0.0.1:{port}?password=hunter2-s3cret"),
            format!("redlock://127.0.0.1:{port}?password=***"),
        ),
    ] {
        let (out, stderr) = run(&url);
        assert!(!out.status.success(), "{url}");
        assert!(!stderr.contains("hunter2"), "{url}: {stderr}");
        assert!(stderr.contains(&shown), "{url}: {stderr}");
    }
}

#[test]
fn a_password_that_is_a_common_word_does_not_mangle_the_message() {
    let port = dead_port();
    let url = format!("redis://u:lock@127.0.0.1:{port}/0");
    let (_, stderr) = run(&url);
    assert!(stderr.contains("cannot use the lock store"), "{stderr}");
    assert!(!stderr.contains("*** store"), "{stderr}");
    assert!(
        stderr.contains(&format!("redis://u:***@127.0.0.1:{port}/0")),
        "{stderr}"
    );
}

#[test]
fn a_forgotten_scheme_gets_a_suggestion() {
    let (out, stderr) = run("localhost:6379");
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("did you mean redis://localhost:6379?"),
        "{stderr}"
    );
}

/// A URL that does not parse is shown once, as typed but for its password, and the
/// message names the part that is wrong by its text.
#[test]
fn a_malformed_url_is_shown_once_without_its_password() {
    let (out, stderr) = run("redis://:hunter2-s3cret@127.0.0.1:99999/");
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert_eq!(
        stderr.matches("redis://:***@127.0.0.1:99999/").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("the port of host '127.0.0.1:99999' is not a number"),
        "{stderr}"
    );
    assert!(!stderr.contains("not shown"), "{stderr}");

    let (out, stderr) = run("nonsense");
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert_eq!(stderr.matches("nonsense").count(), 1, "{stderr}");
    assert!(stderr.contains("not a lock store URL"), "{stderr}");

    let (out, stderr) = run("");
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("the lock store URL is empty"), "{stderr}");
}

/// `user:password@host:port` without a scheme parses as a URL of scheme `user`: its
/// password is hidden all the same.
#[test]
fn a_forgotten_scheme_does_not_show_the_password() {
    for url in [
        "app:hunter2-s3cret@127.0.0.1:6379",
        "app:hunter2-s3cret@127.0.0.1:1234",
    ] {
        let (out, stderr) = run(url);
        assert_eq!(out.status.code(), Some(78), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{url}: {stderr}");
        assert!(stderr.contains("app:***@127.0.0.1"), "{url}: {stderr}");
    }
}
