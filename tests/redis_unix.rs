//! `redis+unix://` through `distlock::connect`: a Redis of its own listening on a Unix
//! socket (and on a loopback port, to show the lock is in that server), and a socket path
//! with nothing behind it.
#![cfg(feature = "redis")]

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use distlock::LockError;

/// The redis-server `scripts/servers.sh` found, else the one on the `PATH`.
fn redis_server() -> String {
    std::env::var("DISTLOCK_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_on_a_unix_socket_is_reached_by_a_redis_unix_url() {
    let dir = ScratchDir::new("redis-unix").unwrap();
    let socket = dir.path().join("redis.sock");
    let port = free_port().unwrap();
    let mut command = Command::new(redis_server());
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--unixsocket")
        .arg(&socket)
        .args([
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path());
    let _server = ServerProcess::start(
        command,
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let url = format!("redis+unix://{}", socket.display());
    let locks = tokio::time::timeout(Duration::from_secs(10), distlock::connect(&url))
        .await
        .unwrap()
        .unwrap();
    let guard = locks
        .lock("over-a-socket")
        .try_acquire()
        .await
        .unwrap()
        .expect("a free key was refused");
    assert!(guard.token().0 > 0, "a fenced grant without a token");
    // The same server over TCP sees the lock held, with its token.
    let tcp = distlock::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap();
    let info = tcp.inspect("over-a-socket").await.unwrap();
    assert_eq!(
        info.map(|i| i.token),
        Some(guard.token()),
        "the lock taken over the socket is not in the server behind it"
    );
    guard.release().await.unwrap();
    assert!(tcp.inspect("over-a-socket").await.unwrap().is_none());
    locks.shutdown().await;
    tcp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_without_a_server_is_unavailable() {
    let dir = ScratchDir::new("redis-unix-none").unwrap();
    let url = format!("redis+unix://{}", dir.path().join("none.sock").display());
    let attempt = async {
        let locks = distlock::connect(&url).await?;
        locks.lock("k").try_acquire().await.map(|_| ())
    };
    match tokio::time::timeout(Duration::from_secs(30), attempt).await {
        Ok(Err(LockError::Unavailable { .. })) => {}
        other => panic!("a socket without a server: {other:?}"),
    }
}
