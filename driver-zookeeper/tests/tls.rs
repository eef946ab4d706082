//! TLS (feature `tls`): a server of the test's own on a `secureClientPort` (Netty, a
//! certificate for 127.0.0.1 signed by a CA made for the test with `openssl`), reached with
//! `zks://…?ca=…`; the same server refuses a client that does not trust its CA.

#![cfg(feature = "tls")]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use lockcore::LockClient;

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl is needed for the TLS test");
    assert!(status.success(), "openssl {args:?} failed");
}

/// A CA, and a server certificate for 127.0.0.1 it signed, as a PKCS#12 keystore.
fn certificates(dir: &Path) {
    openssl(
        dir,
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
            "2",
            "-subj",
            "/CN=distlock-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    );
    openssl(
        dir,
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
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
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
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    openssl(
        dir,
        &[
            "pkcs12",
            "-export",
            "-in",
            "server.pem",
            "-inkey",
            "server.key",
            "-certfile",
            "ca.pem",
            "-out",
            "server.p12",
            "-passout",
            "pass:secret",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.pem",
            "-days",
            "2",
            "-subj",
            "/CN=another-ca",
        ],
    );
}

#[tokio::test]
async fn tls_to_a_secure_client_port() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = ScratchDir::new("zk-tls").unwrap();
        let d = dir.path();
        certificates(d);
        std::fs::create_dir_all(d.join("data")).unwrap();
        let (plain, secure) = (free_port().unwrap(), free_port().unwrap());
        let cfg = format!(
            "tickTime=100\ninitLimit=50\nsyncLimit=20\ndataDir={data}\nclientPort={plain}\n\
             clientPortAddress=127.0.0.1\nsecureClientPort={secure}\n\
             secureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={ks}\nssl.keyStore.password=secret\n\
             ssl.keyStore.type=PKCS12\nssl.clientAuth=none\nadmin.enableServer=false\n",
            data = d.join("data").display(),
            ks = d.join("server.p12").display(),
        );
        std::fs::write(d.join("zoo.cfg"), cfg).unwrap();
        let mut cmd = Command::new("java");
        cmd.args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
        ])
        // Debian's jar does not name netty-codec, which the TLS port's Netty needs.
        .arg(format!(
            "{}:/usr/share/java/netty-codec.jar",
            common::zk_jar()
        ))
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(d.join("zoo.cfg"));
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], secure));
        let _server = ServerProcess::start(cmd, addr, Duration::from_secs(20))
            .await
            .unwrap();
        let ca = d.join("ca.pem");
        let url = format!("zks://127.0.0.1:{secure}/tls?ca={}", ca.display());
        // The port listens before the server serves: the first sessions may be refused.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let backend = loop {
            match distlock_zookeeper::connect(&url).await {
                Ok(b) => break b,
                Err(e) if std::time::Instant::now() > deadline => {
                    panic!("no TLS session: {e}: {:?}", std::error::Error::source(&e))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let locks = LockClient::new(backend);
        let g = locks.lock("over-tls").try_acquire().await.unwrap().unwrap();
        assert_eq!(
            locks.inspect("over-tls").await.unwrap().unwrap().token,
            g.token()
        );
        g.release().await.unwrap();

        let other = d.join("other.pem");
        let url = format!(
            "zks://127.0.0.1:{secure}/tls?ca={}&connect_timeout=2s",
            other.display()
        );
        let err = distlock_zookeeper::connect(&url).await.unwrap_err();
        assert!(
            err.is_retryable() || matches!(err, lockcore::LockError::Backend { .. }),
            "{err}"
        );
    })
    .await
    .expect("the test did not finish in 60 s");
}
