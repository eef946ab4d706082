//! The URL options against real members of their own: user/password authentication and
//! TLS (a CA and a server certificate made with `openssl` for the test).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{etcd_bin, members, wait_ready, TempDir, TTL};
use conformance_tests::process::{free_port, ServerProcess};
use distlock_etcd::etcd_client::Client;
use distlock_etcd::EtcdConfig;
use lockcore::{LockClient, LockError};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A lock round trip through `url`.
async fn round_trip(url: &str) -> Result<(), LockError> {
    let locks = LockClient::new(distlock_etcd::connect(url).await?);
    let g = locks.lock("k").ttl(TTL).try_acquire().await?.expect("free");
    assert!(locks.inspect("k").await?.is_some());
    g.release().await?;
    Ok(())
}

/// An error and its sources on one line, as a log or the CLI shows the whole chain.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    line
}

/// No member listens on the endpoint: an operation fails with `Unavailable` within the
/// URL's timeout, in one line naming the endpoint and the refused connection.
#[test]
fn unreachable_endpoint_is_one_line() {
    runtime().block_on(async {
        let endpoint = format!("127.0.0.1:{}", free_port().unwrap());
        let backend = distlock_etcd::connect(&format!("etcd://{endpoint}?timeout=500ms"))
            .await
            .unwrap();
        let locks = LockClient::new(backend);
        let started = std::time::Instant::now();
        let err = locks.lock("k").ttl(TTL).try_acquire().await.unwrap_err();
        let took = started.elapsed();
        let line = one_line(&err);
        println!("{line}");
        assert!(matches!(err, LockError::Unavailable { .. }), "{line}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert!(
            line.contains(&format!("etcd at {endpoint} ")),
            "the endpoint is not named: {line}"
        );
        assert!(line.to_lowercase().contains("connection refused"), "{line}");
        for dump in [
            "Status {",
            "code:",
            "source:",
            "Some(",
            "ConnectError",
            "\n",
        ] {
            assert!(!line.contains(dump), "{dump:?} in {line}");
        }
    });
}

/// With authentication on, the URL's (percent-encoded) credentials work; a wrong password
/// or none is a clear, non-retryable error, never `Unavailable`.
#[test]
fn user_and_password() {
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let dir = TempDir::new("etcd-auth");
            let mut member = members(1, &dir).pop().unwrap();
            member.start().await.unwrap();
            let endpoint = format!("127.0.0.1:{}", member.client_port);
            wait_ready(
                &EtcdConfig::new([endpoint.clone()]),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
            let password = "p@ss:w/rd%";
            let mut admin = Client::connect([format!("http://{endpoint}")], None)
                .await
                .unwrap();
            admin.user_add("root", "rootpw", None).await.unwrap();
            admin.user_grant_role("root", "root").await.unwrap();
            admin.role_add("locks").await.unwrap();
            admin
                .role_grant_permission(
                    "locks",
                    distlock_etcd::etcd_client::Permission::read_write("app/").with_prefix(),
                )
                .await
                .unwrap();
            admin.user_add("app", password, None).await.unwrap();
            admin.user_grant_role("app", "locks").await.unwrap();
            admin.auth_enable().await.unwrap();

            round_trip(&format!(
                "etcd://app:p%40ss%3Aw%2Frd%25@{endpoint}/app?timeout=2s"
            ))
            .await
            .unwrap();
            for (url, what) in [
                (
                    format!("etcd://app:wrong@{endpoint}/app?timeout=2s"),
                    "a wrong password",
                ),
                (
                    format!("etcd://{endpoint}/app?timeout=2s"),
                    "no credentials",
                ),
                // Permissions cover app/ only.
                (
                    format!("etcd://app:p%40ss%3Aw%2Frd%25@{endpoint}/other?timeout=2s"),
                    "a namespace without permission",
                ),
            ] {
                let err = round_trip(&url).await.unwrap_err();
                assert!(
                    matches!(err, LockError::Backend { .. }) && !err.is_retryable(),
                    "{what}: {err:?}"
                );
                let line = one_line(&err);
                println!("{what}: {line}");
                assert!(!line.contains("p@ss"), "{line}");
                // One line: the endpoint and what etcd said, not a gRPC status dump.
                assert!(
                    line.contains(&format!("etcd at {endpoint} ")),
                    "{what}: the endpoint is not named: {line}"
                );
                for dump in ["Status {", "code:", "metadata", "MetadataMap", "\n"] {
                    assert!(!line.contains(dump), "{what}: {dump:?} in {line}");
                }
            }
        })
        .await
        .expect("timed out");
    });
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl is needed for the TLS test");
    assert!(status.success(), "openssl {args:?} failed");
}

/// `etcds://…?ca=` speaks TLS to a member serving a certificate of that CA; without the
/// CA, or over plain `etcd://`, it fails.
#[test]
fn tls_with_ca() {
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let dir = TempDir::new("etcd-tls");
            let d = dir.0.as_path();
            openssl(
                d,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=distlock test CA",
                ],
            );
            openssl(
                d,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=127.0.0.1",
                ],
            );
            std::fs::write(
                d.join("san.ext"),
                "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
            )
            .unwrap();
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    "server.csr",
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    "server.pem",
                    "-days",
                    "1",
                    "-extfile",
                    "san.ext",
                ],
            );
            let (c, p) = (free_port().unwrap(), free_port().unwrap());
            let mut cmd = Command::new(etcd_bin());
            cmd.args(["--name", "tls", "--data-dir"])
                .arg(d.join("data"));
            cmd.args(["--listen-client-urls", &format!("https://127.0.0.1:{c}")]);
            cmd.args(["--advertise-client-urls", &format!("https://127.0.0.1:{c}")]);
            cmd.args(["--listen-peer-urls", &format!("http://127.0.0.1:{p}")]);
            cmd.args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{p}"),
            ]);
            cmd.args(["--initial-cluster", &format!("tls=http://127.0.0.1:{p}")]);
            cmd.arg("--cert-file").arg(d.join("server.pem"));
            cmd.arg("--key-file").arg(d.join("server.key"));
            let _server =
                ServerProcess::start(cmd, ([127, 0, 0, 1], c).into(), Duration::from_secs(10))
                    .await
                    .unwrap();
            let ca = d.join("ca.pem");
            let url = format!("etcds://127.0.0.1:{c}/tls?ca={}&timeout=2s", ca.display());
            let started = std::time::Instant::now();
            loop {
                match round_trip(&url).await {
                    Ok(()) => break,
                    Err(e) if started.elapsed() > Duration::from_secs(10) => {
                        panic!("TLS round trip failed: {e}")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            let url = format!(
                "etcd://127.0.0.1:{c}/tls?tls=true&ca={}&domain=localhost&timeout=2s",
                ca.display()
            );
            round_trip(&url).await.unwrap();
            let err = round_trip(&format!("etcds://127.0.0.1:{c}/tls?timeout=2s"))
                .await
                .unwrap_err();
            assert!(matches!(err, LockError::Config { .. }), "{err:?}");
            let err = round_trip(&format!("etcd://127.0.0.1:{c}/tls?timeout=1s"))
                .await
                .unwrap_err();
            assert!(err.is_retryable(), "plain text to a TLS member: {err:?}");
        })
        .await
        .expect("timed out");
    });
}
