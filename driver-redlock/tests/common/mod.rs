//! The redlock test harness: clients of the shared test servers (three or five of
//! `DISTLOCK_TEST_REDLOCK_URLS`) under a fresh prefix, and redis-server processes of their
//! own for fault scenarios, each client talking to each instance through a proxy of its own.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use conformance_tests::{FaultClient, FaultLink, FaultStore, Harness, Restart, Tamper, TcpProxy};
use distlock_redlock::{RedlockBackend, RedlockBackendBuilder};
use lockcore::driver::OwnerToken;
use lockcore::{LockClient, LockError, LockKey};

/// The per-instance timeout of test clients: short, so faults are noticed quickly, and
/// long enough for a loaded 2-core machine running many tests at once.
pub const INSTANCE_TIMEOUT: Duration = Duration::from_millis(500);

/// The connect bound of test clients: above the time `hold_survives_slow_reconnect` holds a
/// new connection back (three quarters of `ttl()`, and a little more). A stopped instance refuses a
/// connection at once, so the other scenarios do not wait for it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The shared Redlock test servers' URLs, or a failure that says how to get them.
pub fn shared_urls() -> Vec<String> {
    let urls: Vec<String> = std::env::var("DISTLOCK_TEST_REDLOCK_URLS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if urls.len() < 5 {
        panic!(
            "DISTLOCK_TEST_REDLOCK_URLS does not hold five redis URLs: run `scripts/servers.sh \
             start` and the tests through `scripts/test.sh` (or source target/test-servers.env)"
        );
    }
    urls
}

/// A prefix no other harness or run uses.
pub fn fresh_prefix() -> String {
    format!("distlock-test:{}:", &OwnerToken::generate().to_hex()[..16])
}

/// Clients of `instances` of the shared servers, all under one fresh prefix.
pub struct RedlockHarness {
    pub urls: Vec<String>,
    pub prefix: String,
    /// Whether its clients (and its fault stores' clients) run the fencing round.
    pub fencing: bool,
}

impl RedlockHarness {
    pub fn new(instances: usize) -> Self {
        RedlockHarness {
            urls: shared_urls().into_iter().take(instances).collect(),
            prefix: fresh_prefix(),
            fencing: true,
        }
    }

    /// The same, with fencing switched off (the plain `SET NX PX` grant).
    pub fn unfenced(instances: usize) -> Self {
        RedlockHarness {
            fencing: false,
            ..RedlockHarness::new(instances)
        }
    }

    pub fn builder(&self) -> RedlockBackendBuilder {
        RedlockBackend::builder(self.urls.clone())
            .prefix(&self.prefix)
            .instance_timeout(INSTANCE_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .fencing(self.fencing)
    }
}

#[async_trait]
impl Harness for RedlockHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.builder().build().await?))
    }

    fn ttl(&self) -> Duration {
        // Generous: the whole suite runs in parallel against five servers on 2 cores, and a
        // Redlock lease is only valid if a majority answers well within it.
        Duration::from_secs(1)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let mut store = RedlockFaultStore::start(self.urls.len())
            .await
            .map_err(|e| LockError::unavailable("redlock", e))?;
        store.fencing = self.fencing;
        Ok(Some(Box::new(store)))
    }
}

/// The redis-server binary to run.
pub fn server_bin() -> String {
    std::env::var("DISTLOCK_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

/// Starts a redis-server of our own on `port`, empty (no RDB, no AOF).
pub async fn start_server(port: u16) -> std::io::Result<ServerProcess> {
    start_server_in(port, None).await
}

/// Starts a redis-server on `port` whose RDB file, if it saves one, is `dir/dump-PORT.rdb`.
pub async fn start_server_in(
    port: u16,
    dir: Option<&std::path::Path>,
) -> std::io::Result<ServerProcess> {
    let mut cmd = Command::new(server_bin());
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"]);
    if let Some(dir) = dir {
        cmd.arg("--dir")
            .arg(dir)
            .args(["--dbfilename", &format!("dump-{port}.rdb")]);
    }
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    ServerProcess::start(cmd, addr, Duration::from_secs(10)).await
}

/// N redis-server processes for one fault scenario.
pub struct RedlockFaultStore {
    pub ports: Vec<u16>,
    servers: Vec<tokio::sync::Mutex<Option<ServerProcess>>>,
    /// Where a restart keeping the data leaves each instance's RDB file.
    dir: ScratchDir,
    pub prefix: String,
    /// Whether its clients run the fencing round (default on).
    pub fencing: bool,
}

impl RedlockFaultStore {
    pub async fn start(instances: usize) -> std::io::Result<Self> {
        let mut ports = Vec::new();
        let mut servers = Vec::new();
        let dir = ScratchDir::new("redlock")?;
        for _ in 0..instances {
            let port = free_port()?;
            let server = start_server_in(port, Some(dir.path())).await?;
            servers.push(tokio::sync::Mutex::new(Some(server)));
            ports.push(port);
        }
        Ok(RedlockFaultStore {
            ports,
            servers,
            dir,
            prefix: fresh_prefix(),
            fencing: true,
        })
    }

    pub fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.ports[i])
    }

    pub fn urls(&self) -> Vec<String> {
        (0..self.ports.len()).map(|i| self.url(i)).collect()
    }

    /// A builder for a client talking to the instances directly.
    pub fn builder(&self) -> RedlockBackendBuilder {
        RedlockBackend::builder(self.urls())
            .prefix(&self.prefix)
            .instance_timeout(INSTANCE_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .fencing(self.fencing)
    }

    /// A backend whose connection to every instance goes through a proxy of its own.
    pub async fn proxied_backend(
        &self,
    ) -> Result<(Arc<RedlockBackend>, Arc<ProxiesLink>), LockError> {
        let mut proxies = Vec::new();
        for port in &self.ports {
            let proxy = TcpProxy::start(([127, 0, 0, 1], *port).into())
                .await
                .map_err(|e| LockError::unavailable("redlock", e))?;
            proxies.push(proxy);
        }
        let urls: Vec<String> = proxies
            .iter()
            .map(|p| format!("redis://{}/", p.addr()))
            .collect();
        let backend = RedlockBackend::builder(urls)
            .prefix(&self.prefix)
            .instance_timeout(INSTANCE_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .fencing(self.fencing)
            .build()
            .await?;
        Ok((backend, Arc::new(ProxiesLink { proxies })))
    }

    /// Kills instance `i` (SIGKILL): its data is gone.
    pub async fn kill(&self, i: usize) {
        if let Some(mut server) = self.servers[i].lock().await.take() {
            server.kill();
        }
    }

    /// Starts instance `i` again, empty, on its port.
    pub async fn restart(&self, i: usize) {
        if let Err(e) = self.try_restart(i).await {
            panic!("{e}");
        }
    }

    /// Starts instance `i` again, empty, on its port, unless it runs.
    pub async fn try_restart(&self, i: usize) -> Result<(), LockError> {
        let mut server = self.servers[i].lock().await;
        if server.is_none() {
            let started = start_server_in(self.ports[i], Some(self.dir.path()))
                .await
                .map_err(|e| {
                    LockError::unavailable(
                        "redlock",
                        format!("restart on port {}: {e}", self.ports[i]),
                    )
                })?;
            *server = Some(started);
        }
        Ok(())
    }

    /// Sends a signal (`STOP`, `CONT`) to instance `i`.
    pub async fn signal(&self, i: usize, signal: &str) {
        let server = self.servers[i].lock().await;
        if let Some(s) = server.as_ref() {
            s.signal(signal).expect("signal the redis-server");
        }
    }
}

#[async_trait]
impl FaultStore for RedlockFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let (backend, link) = self.proxied_backend().await?;
        Ok(FaultClient {
            client: LockClient::new(backend),
            link,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        for i in 0..self.servers.len() {
            self.kill(i).await;
        }
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        for i in 0..self.servers.len() {
            self.try_restart(i).await?;
        }
        Ok(())
    }

    /// Keeping the data: `SHUTDOWN SAVE` on every instance, then starts that load what
    /// they saved. Losing it: SIGKILL with nothing saved.
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        for i in 0..self.servers.len() {
            match how {
                Restart::KeepData => shutdown_saving(&self.url(i)).await?,
                Restart::LoseData => {
                    let _ = std::fs::remove_file(
                        self.dir.path().join(format!("dump-{}.rdb", self.ports[i])),
                    );
                }
                other => return Err(LockError::config(format!("{other:?} is not implemented"))),
            }
            self.kill(i).await;
        }
        self.start().await?;
        Ok(true)
    }

    /// Plain commands on every instance, as `redis-cli` would: `DEL` of the lock key and
    /// the shared leases (the fence keys stay), or the lock value written again with
    /// `SET … KEEPTTL`.
    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        use driver_redis::redis::AsyncCommands;
        let names = driver_redis::__redlock::names(&self.prefix, key);
        // One stranger on every instance, as another Redlock client would be.
        let stranger = lockcore::Owner::new("stranger").token().to_hex();
        let mut rewritten = 0;
        for url in self.urls() {
            let client = driver_redis::redis::Client::open(url.as_str())
                .map_err(|e| LockError::config(e.to_string()))?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| LockError::unavailable("redlock", e))?;
            match how {
                Tamper::Delete => {
                    let _: i64 = conn
                        .del(&[names.lock.clone(), names.leases(), names.claims()])
                        .await
                        .map_err(|e| LockError::unavailable("redlock", e))?;
                }
                Tamper::Reassign => {
                    rewritten += rewrite_value(&mut conn, &names.lock, Some(&stranger)).await?;
                }
                Tamper::Rewrite => rewritten += rewrite_value(&mut conn, &names.lock, None).await?,
                other => return Err(LockError::config(format!("{other:?} is not implemented"))),
            }
        }
        if matches!(how, Tamper::Reassign | Tamper::Rewrite) && rewritten == 0 {
            return Err(LockError::config(format!(
                "no instance holds a lock value of {:?} to rewrite",
                key.as_str()
            )));
        }
        Ok(())
    }
}

/// One client's links to every instance, disturbed together: the client looks paused or
/// slow to all of them at once.
pub struct ProxiesLink {
    pub proxies: Vec<TcpProxy>,
}

#[async_trait]
impl FaultLink for ProxiesLink {
    async fn pause(&self) {
        for p in &self.proxies {
            p.pause().await;
        }
    }

    async fn resume(&self) {
        for p in &self.proxies {
            p.resume().await;
        }
    }

    async fn delay_answers(&self, delay: Duration) {
        for p in &self.proxies {
            p.delay_answers(delay).await;
        }
    }

    async fn slow_connects(&self, delay: Duration) -> bool {
        let mut all = true;
        for p in &self.proxies {
            all &= p.slow_connects(delay).await;
        }
        all
    }

    async fn cut(&self) -> bool {
        let mut all = true;
        for p in &self.proxies {
            all &= p.cut().await;
        }
        all
    }
}

/// Stops the redis-server at `url` with `SHUTDOWN SAVE`: it writes its data to its RDB file
/// and exits (the connection closes without an answer).
pub async fn shutdown_saving(url: &str) -> Result<(), LockError> {
    let client =
        driver_redis::redis::Client::open(url).map_err(|e| LockError::config(e.to_string()))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| LockError::unavailable("redlock", e))?;
    // The server exits before it answers: the error is the expected end of the call.
    let _: Result<(), _> = driver_redis::redis::cmd("SHUTDOWN")
        .arg("SAVE")
        .query_async(&mut conn)
        .await;
    Ok(())
}

/// Writes the lock value at `lock` again with `SET … KEEPTTL`: the same value, or with its
/// owner (the 32 hex digits it starts with) replaced by `owner`. How many values it
/// rewrote: none where the instance holds no lock value (it did not grant the lock).
async fn rewrite_value(
    conn: &mut driver_redis::redis::aio::MultiplexedConnection,
    lock: &str,
    owner: Option<&str>,
) -> Result<u32, LockError> {
    use driver_redis::redis::AsyncCommands;
    let failed = |e| LockError::unavailable("redlock", e);
    let value: Option<String> = conn.get(lock).await.map_err(failed)?;
    let Some(mut value) = value else {
        return Ok(0);
    };
    if let Some(owner) = owner {
        value.replace_range(..owner.len().min(value.len()), owner);
    }
    let _: () = driver_redis::redis::cmd("SET")
        .arg(lock)
        .arg(value)
        .arg("KEEPTTL")
        .query_async(conn)
        .await
        .map_err(failed)?;
    Ok(1)
}
