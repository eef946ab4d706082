//! TLS and passwords on the two topologies: a one-node Redis Cluster that speaks only TLS
//! and wants a password (`rediss+cluster://`), and a master and sentinel that speak only
//! TLS, each with a password of its own (`rediss+sentinel://`). Wrong passwords are clear
//! errors, never hangs or panics, and never quote the password.

mod common;

use std::time::Duration;

use common::{bounded, start_server_ready_on, TestCerts};
use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use distlock_redis::RedisBackend;
use lockcore::{LockClient, LockError};

const PASSWORD: &str = "master-s3cret";
const SENTINEL_PASSWORD: &str = "sentinel-s3cret";

/// `redis-cli` over TLS to the server on `port`.
fn cli(certs: &TestCerts, port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["--tls", "--cacert"])
        .arg(&certs.ca)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--no-auth-warning",
        ])
        .args(["-a", PASSWORD])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn backend(url: &str, certs: &TestCerts) -> Result<std::sync::Arc<RedisBackend>, LockError> {
    RedisBackend::builder(url)
        .tls_root_certificate(std::fs::read(&certs.ca).unwrap())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
}

/// Takes a lock, has a second client wait for it, and releases: the waiter is served by
/// the release's announcement, long before the 30 s TTL.
async fn hand_over(first: LockClient, second: LockClient) {
    let ttl = Duration::from_secs(30);
    let held = first.lock("secure").ttl(ttl).acquire().await.unwrap();
    let waiter = tokio::spawn(async move { second.lock("secure").ttl(ttl).acquire().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let token = held.token();
    held.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(next.token() > token);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_a_password() {
    bounded(async {
        let certs = TestCerts::make();
        let dir = ScratchDir::new("redis-cluster-tls").unwrap();
        let (port, bus) = (free_port().unwrap(), free_port().unwrap());
        let mut args: Vec<String> = vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cluster".into(),
            "yes".into(),
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-port".into(),
            bus.to_string(),
            "--cluster-config-file".into(),
            dir.path().join("nodes.conf").display().to_string(),
            "--dir".into(),
            dir.path().display().to_string(),
            "--requirepass".into(),
            PASSWORD.into(),
            "--masterauth".into(),
            PASSWORD.into(),
        ];
        args.extend(certs.server_args());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let _server = start_server_ready_on(0, port, &refs).await.unwrap();
        assert!(cli(&certs, port, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]).contains("OK"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cli(&certs, port, &["CLUSTER", "INFO"]).contains("cluster_state:ok") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cluster is not ok"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let url = format!("rediss+cluster://:{PASSWORD}@127.0.0.1:{port}/");
        let first = LockClient::new(backend(&url, &certs).await.unwrap());
        let second = LockClient::new(backend(&url, &certs).await.unwrap());
        hand_over(first, second).await;

        // A wrong password is refused with an error that does not quote it.
        let wrong = backend(
            &format!("rediss+cluster://:wrong-pw@127.0.0.1:{port}/"),
            &certs,
        )
        .await
        .unwrap_err();
        eprintln!("wrong cluster password: {}", lockcore::ErrorChain(&wrong));
        assert!(matches!(wrong, LockError::Backend { .. }), "{wrong:?}");
        assert!(
            !format!("{wrong} {wrong:?}").contains("wrong-pw"),
            "{wrong:?}"
        );
        // Plain TCP to a TLS-only cluster fails promptly, as unavailable.
        let plain = backend(
            &format!("redis+cluster://:{PASSWORD}@127.0.0.1:{port}/"),
            &certs,
        )
        .await
        .unwrap_err();
        assert!(matches!(plain, LockError::Unavailable { .. }), "{plain:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_sentinel_and_master_each_with_a_password() {
    bounded(async {
        let certs = TestCerts::make();
        let master_dir = ScratchDir::new("redis-master-tls").unwrap();
        let master_port = free_port().unwrap();
        let mut args: Vec<String> = vec![
            "--tls-port".into(),
            master_port.to_string(),
            "--tls-replication".into(),
            "yes".into(),
            "--dir".into(),
            master_dir.path().display().to_string(),
            "--requirepass".into(),
            PASSWORD.into(),
        ];
        args.extend(certs.server_args());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let _master = start_server_ready_on(0, master_port, &refs).await.unwrap();

        let sentinel_dir = ScratchDir::new("redis-sentinel-tls").unwrap();
        let sentinel_port = free_port().unwrap();
        let conf = sentinel_dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port 0\ntls-port {sentinel_port}\ntls-replication yes\n\
                 tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n\
                 requirepass {SENTINEL_PASSWORD}\n\
                 sentinel monitor secure 127.0.0.1 {master_port} 1\n\
                 sentinel auth-pass secure {PASSWORD}\n",
                certs.cert.display(),
                certs.key.display(),
                certs.ca.display()
            ),
        )
        .unwrap();
        let mut cmd = std::process::Command::new(common::server_bin());
        cmd.arg(&conf)
            .args(["--bind", "127.0.0.1", "--sentinel"])
            .arg("--dir")
            .arg(sentinel_dir.path());
        let _sentinel = ServerProcess::start(
            cmd,
            ([127, 0, 0, 1], sentinel_port).into(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();

        let url = format!(
            "rediss+sentinel://:{PASSWORD}@127.0.0.1:{sentinel_port}/secure?sentinel_password={SENTINEL_PASSWORD}"
        );
        let first = LockClient::new(backend(&url, &certs).await.unwrap());
        let second = LockClient::new(backend(&url, &certs).await.unwrap());
        hand_over(first, second).await;

        for (url, secret) in [
            (
                format!("rediss+sentinel://:{PASSWORD}@127.0.0.1:{sentinel_port}/secure?sentinel_password=wrong-spw"),
                "wrong-spw",
            ),
            (
                format!("rediss+sentinel://:wrong-mpw@127.0.0.1:{sentinel_port}/secure?sentinel_password={SENTINEL_PASSWORD}"),
                "wrong-mpw",
            ),
        ] {
            let started = tokio::time::Instant::now();
            let e = backend(&url, &certs).await.unwrap_err();
            // Refused credentials are not worth retrying.
            assert!(matches!(e, LockError::Backend { .. }), "{e:?}");
            assert!(started.elapsed() < Duration::from_secs(10));
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(secret) && !shown.contains(PASSWORD), "{shown}");
            eprintln!("{secret}: {}", lockcore::ErrorChain(&e));
        }
    })
    .await;
}
