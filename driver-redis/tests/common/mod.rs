//! The redis test harness: clients of the shared test server under a fresh prefix, and
//! redis-server processes of their own for fault scenarios.
#![allow(dead_code)]

pub mod cluster;
pub mod contention;
pub mod sentinel;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper, TcpProxy};
use distlock_redis::RedisBackend;
use lockcore::driver::OwnerToken;
use lockcore::{LockClient, LockError, LockKey};

/// Connect and response bound used by test clients: short, so a fault is noticed quickly.
pub const TIMEOUT: Duration = Duration::from_millis(500);

/// Every test finishes within this or fails.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Runs `test` within [`LIMIT`].
pub async fn bounded<F: std::future::Future<Output = ()>>(test: F) {
    tokio::time::timeout(LIMIT, test)
        .await
        .expect("the test did not finish in time");
}

/// A plain connection to `url`, to look at what the backend stored.
pub async fn raw(url: &str) -> distlock_redis::redis::aio::MultiplexedConnection {
    distlock_redis::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub fn key(k: &str) -> lockcore::LockKey {
    lockcore::LockKey::new(k).unwrap()
}

/// The shared test server's URL, or a failure that says how to get one.
pub fn shared_url() -> String {
    match std::env::var("DISTLOCK_TEST_REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "DISTLOCK_TEST_REDIS_URL is not set: run `scripts/servers.sh start` and the tests \
             through `scripts/test.sh` (or export the variables from target/test-servers.env)"
        ),
    }
}

/// `url` with one more query option.
pub fn with_option(url: &str, option: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{option}")
}

/// A prefix no other harness or run uses.
pub fn fresh_prefix() -> String {
    format!("distlock-test:{}:", &OwnerToken::generate().to_hex()[..16])
}

/// Clients of the shared server, all under one fresh prefix.
pub struct RedisHarness {
    pub url: String,
    pub prefix: String,
    /// Whether the backends take fencing tokens (`?fencing=false` when not).
    pub fencing: bool,
}

impl RedisHarness {
    pub fn new() -> Self {
        RedisHarness {
            url: shared_url(),
            prefix: fresh_prefix(),
            fencing: true,
        }
    }

    /// Clients whose backends run with fencing switched off, set by the URL.
    #[allow(dead_code)]
    pub fn unfenced() -> Self {
        RedisHarness {
            url: with_option(&shared_url(), "fencing=false"),
            fencing: false,
            ..RedisHarness::new()
        }
    }

    pub async fn backend(&self) -> Result<Arc<RedisBackend>, LockError> {
        RedisBackend::builder(&self.url)
            .prefix(&self.prefix)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await
    }
}

#[async_trait::async_trait]
impl Harness for RedisHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.backend().await?))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(400)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let mut store = RedisFaultStore::start(&[])
            .await
            .map_err(|e| LockError::unavailable("redis", e))?;
        store.fencing = self.fencing;
        Ok(Some(Box::new(store)))
    }
}

/// A private CA and a server certificate for 127.0.0.1 signed by it, in a directory of
/// their own (removed when dropped).
pub struct TestCerts {
    pub dir: std::path::PathBuf,
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl TestCerts {
    pub fn make() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "distlock-redis-tls-{}-{}",
            std::process::id(),
            &OwnerToken::generate().to_hex()[..8]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let script = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=distlock-test-ca \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
  -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout key.pem -out server.csr
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' > ext.cnf
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
  -extfile ext.cnf -out cert.pem
"#;
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect(
                "sh and openssl are needed to make test certificates (apt-get install openssl)",
            );
        assert!(
            status.success(),
            "openssl could not make the test certificates"
        );
        TestCerts {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            dir,
        }
    }

    /// redis-server's options for TLS with these certificates (clients not authenticated).
    pub fn server_args(&self) -> Vec<String> {
        vec![
            "--tls-cert-file".into(),
            self.cert.display().to_string(),
            "--tls-key-file".into(),
            self.key.display().to_string(),
            "--tls-ca-cert-file".into(),
            self.ca.display().to_string(),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The redis-server binary to run.
pub fn server_bin() -> String {
    std::env::var("DISTLOCK_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

/// Starts a redis-server of our own on `port` (not daemonized, so the PID is the child).
pub async fn start_server(port: u16, extra: &[&str]) -> std::io::Result<ServerProcess> {
    start_server_ready_on(port, port, extra).await
}

/// Starts a redis-server with `--port port` and waits until `ready_port` accepts
/// connections (they differ for a TLS-only server: `--port 0 --tls-port P`).
pub async fn start_server_ready_on(
    port: u16,
    ready_port: u16,
    extra: &[&str],
) -> std::io::Result<ServerProcess> {
    let mut cmd = Command::new(server_bin());
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra);
    let addr: SocketAddr = ([127, 0, 0, 1], ready_port).into();
    ServerProcess::start(cmd, addr, Duration::from_secs(10)).await
}

/// A redis-server process for one fault scenario; every client talks through a proxy of
/// its own.
pub struct RedisFaultStore {
    pub port: u16,
    extra: Vec<String>,
    /// Where a restart keeping the data leaves the RDB file.
    dir: ScratchDir,
    server: tokio::sync::Mutex<Option<ServerProcess>>,
    pub prefix: String,
    /// Whether its backends take fencing tokens.
    pub fencing: bool,
}

impl RedisFaultStore {
    pub async fn start(extra: &[&str]) -> std::io::Result<Self> {
        let port = free_port()?;
        let dir = ScratchDir::new("redis")?;
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra.extend(["--dir".to_owned(), dir.path().display().to_string()]);
        let args: Vec<&str> = extra.iter().map(String::as_str).collect();
        let server = start_server(port, &args).await?;
        Ok(RedisFaultStore {
            port,
            extra,
            dir,
            server: tokio::sync::Mutex::new(Some(server)),
            prefix: fresh_prefix(),
            fencing: true,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A backend behind a proxy of its own, and the proxy.
    pub async fn proxied_backend(&self) -> Result<(Arc<RedisBackend>, Arc<TcpProxy>), LockError> {
        let proxy = Arc::new(
            TcpProxy::start(self.addr())
                .await
                .map_err(|e| LockError::unavailable("redis", e))?,
        );
        let backend = RedisBackend::builder(format!("redis://{}/", proxy.addr()))
            .prefix(&self.prefix)
            .fencing(self.fencing)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await?;
        Ok((backend, proxy))
    }
}

#[async_trait::async_trait]
impl FaultStore for RedisFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let (backend, proxy) = self.proxied_backend().await?;
        Ok(FaultClient {
            client: LockClient::new(backend),
            link: proxy,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        if let Some(mut server) = self.server.lock().await.take() {
            server.kill();
        }
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        let mut server = self.server.lock().await;
        if server.is_none() {
            let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
            let started = start_server(self.port, &extra).await.map_err(|e| {
                LockError::unavailable("redis", format!("restart on port {}: {e}", self.port))
            })?;
            *server = Some(started);
        }
        Ok(())
    }

    /// Keeping the data: `SHUTDOWN SAVE` (an RDB file in the store's own directory), then a
    /// start that loads it. Losing it: SIGKILL with nothing saved.
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        match how {
            Restart::KeepData => shutdown_saving(&self.url()).await?,
            Restart::LoseData => {
                let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
            }
            other => return Err(LockError::config(format!("{other:?} is not implemented"))),
        }
        self.stop().await?;
        self.start().await?;
        Ok(true)
    }

    /// Plain commands, as `redis-cli` would: `DEL` of the lock key and the shared leases
    /// (the fence key stays), or the lock value written again with `SET … KEEPTTL`.
    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        tamper(&self.url(), &self.prefix, key, how).await
    }
}

/// Changes `key`'s lock record on the server at `url` with plain commands, not the
/// driver's scripts.
pub async fn tamper(url: &str, prefix: &str, key: &LockKey, how: Tamper) -> Result<(), LockError> {
    use distlock_redis::redis::AsyncCommands;
    let names = distlock_redis::__redlock::names(prefix, key);
    let client =
        distlock_redis::redis::Client::open(url).map_err(|e| LockError::config(e.to_string()))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| LockError::unavailable("redis", e))?;
    match how {
        Tamper::Delete => {
            let _: i64 = conn
                .del(&[names.lock.clone(), names.leases(), names.claims()])
                .await
                .map_err(|e| LockError::unavailable("redis", e))?;
        }
        Tamper::Reassign => {
            let stranger = lockcore::Owner::new("stranger");
            rewrite_value(&mut conn, &names.lock, Some(&stranger.token().to_hex())).await?;
        }
        Tamper::Rewrite => rewrite_value(&mut conn, &names.lock, None).await?,
        other => return Err(LockError::config(format!("{other:?} is not implemented"))),
    }
    Ok(())
}

/// Writes the lock value at `lock` again with `SET … KEEPTTL`, as `redis-cli` would: the
/// same value, or with its owner (the 32 hex digits it starts with) replaced by `owner`.
pub async fn rewrite_value(
    conn: &mut distlock_redis::redis::aio::MultiplexedConnection,
    lock: &str,
    owner: Option<&str>,
) -> Result<(), LockError> {
    use distlock_redis::redis::AsyncCommands;
    let failed = |e| LockError::unavailable("redis", e);
    let value: Option<String> = conn.get(lock).await.map_err(failed)?;
    let Some(mut value) = value else {
        return Err(LockError::config(format!(
            "no lock value at {lock} to rewrite"
        )));
    };
    if let Some(owner) = owner {
        value.replace_range(..owner.len().min(value.len()), owner);
    }
    let _: () = distlock_redis::redis::cmd("SET")
        .arg(lock)
        .arg(value)
        .arg("KEEPTTL")
        .query_async(conn)
        .await
        .map_err(failed)?;
    Ok(())
}

/// Stops the redis-server at `url` with `SHUTDOWN SAVE`: it writes its data to an RDB file
/// in its directory and exits (the connection closes without an answer).
pub async fn shutdown_saving(url: &str) -> Result<(), LockError> {
    let client =
        distlock_redis::redis::Client::open(url).map_err(|e| LockError::config(e.to_string()))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| LockError::unavailable("redis", e))?;
    // The server exits before it answers: the error is the expected end of the call.
    let _: Result<(), _> = distlock_redis::redis::cmd("SHUTDOWN")
        .arg("SAVE")
        .query_async(&mut conn)
        .await;
    Ok(())
}
