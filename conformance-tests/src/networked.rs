//! A ready-made [`FaultStore`] for a store that is a server process: the server on a free
//! loopback port, a [`TcpProxy`] per client, stop and start by PID.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{LockBackend, LockClient, LockError, LockKey};

use crate::harness::{FaultClient, FaultStore, Tamper};
use crate::process::{free_port, ServerProcess};
use crate::proxy::TcpProxy;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Connect =
    Box<dyn Fn(SocketAddr) -> BoxFuture<Result<Arc<dyn LockBackend>, LockError>> + Send + Sync>;
type TamperFn =
    Box<dyn Fn(SocketAddr, LockKey, Tamper) -> BoxFuture<Result<(), LockError>> + Send + Sync>;
type Launch = Box<dyn Fn(u16) -> Command + Send + Sync>;

/// A server process of its own for one fault scenario, whose every client talks to it
/// through a [`TcpProxy`] of its own: the fault hooks of a networked store with none of
/// the plumbing written by the driver.
///
/// You give it how to launch the server on a port (a [`Command`] that runs the server
/// itself in the foreground, so its PID is the server's), how to connect a backend to an
/// address, and — for [`FaultStore::tamper`] — how to delete a lock record with the store's
/// own tools.
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// use std::process::Command;
/// use std::sync::Arc;
/// use distlock_conformance::NetworkedStore;
/// use distlock_core::LockBackend;
/// # async fn connect(url: String) -> Result<Arc<dyn LockBackend>, distlock_core::LockError> {
/// #     Ok(lockcore::memory::MemoryBackend::new())
/// # }
/// # async fn example() -> Result<(), distlock_core::LockError> {
/// let store = NetworkedStore::start(
///     |port| {
///         let mut c = Command::new("redis-server");
///         c.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""]);
///         c
///     },
///     |addr| async move { connect(format!("redis://{addr}/")).await },
/// )
/// .await?;
/// # Ok(()) }
/// ```
pub struct NetworkedStore {
    port: u16,
    launch: Launch,
    connect: Connect,
    tamper: Option<TamperFn>,
    ready_within: Duration,
    server: tokio::sync::Mutex<Option<ServerProcess>>,
}

impl std::fmt::Debug for NetworkedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkedStore")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl NetworkedStore {
    /// Starts the server `launch(port)` on a free loopback port and waits (up to 30 s)
    /// until it accepts connections. `connect(addr)` makes a backend talking to `addr`:
    /// the proxy's address for each client.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the server did not start or accept connections in time.
    pub async fn start<L, C, F>(launch: L, connect: C) -> Result<Self, LockError>
    where
        L: Fn(u16) -> Command + Send + Sync + 'static,
        C: Fn(SocketAddr) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Arc<dyn LockBackend>, LockError>> + Send + 'static,
    {
        let port = free_port().map_err(|e| LockError::unavailable("test server", e))?;
        let store = NetworkedStore {
            port,
            launch: Box::new(launch),
            connect: Box::new(move |addr| Box::pin(connect(addr))),
            tamper: None,
            ready_within: Duration::from_secs(30),
            server: tokio::sync::Mutex::new(None),
        };
        store.start().await?;
        Ok(store)
    }

    /// Implements [`FaultStore::tamper`] with `tamper(server_addr, key, how)`, which
    /// changes the record with the store's own tools (a plain connection to the server,
    /// not the driver).
    pub fn with_tamper<T, F>(mut self, tamper: T) -> Self
    where
        T: Fn(SocketAddr, LockKey, Tamper) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), LockError>> + Send + 'static,
    {
        self.tamper = Some(Box::new(move |addr, key, how| {
            Box::pin(tamper(addr, key, how))
        }));
        self
    }

    /// The server's own address (not a proxy's).
    pub fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// The PID of the server while it runs.
    pub async fn pid(&self) -> Option<u32> {
        self.server
            .lock()
            .await
            .as_ref()
            .and_then(ServerProcess::pid)
    }
}

#[async_trait]
impl FaultStore for NetworkedStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let proxy = TcpProxy::start(self.addr())
            .await
            .map_err(|e| LockError::unavailable("test proxy", e))?;
        let backend = (self.connect)(proxy.addr()).await?;
        Ok(FaultClient {
            client: LockClient::new(backend),
            link: Arc::new(proxy),
        })
    }

    /// Kills the server (SIGKILL): what it had not written to disk is gone.
    async fn stop(&self) -> Result<(), LockError> {
        if let Some(mut server) = self.server.lock().await.take() {
            server.kill();
        }
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        let mut server = self.server.lock().await;
        if server.is_none() {
            let started =
                ServerProcess::start((self.launch)(self.port), self.addr(), self.ready_within)
                    .await
                    .map_err(|e| {
                        LockError::unavailable(
                            "test server",
                            format!("start on port {}: {e}", self.port),
                        )
                    })?;
            *server = Some(started);
        }
        Ok(())
    }

    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        match &self.tamper {
            Some(tamper) => tamper(self.addr(), key.clone(), how).await,
            None => Err(LockError::config(format!(
                "this NetworkedStore cannot tamper with a lock record ({how:?}): give it \
                 NetworkedStore::with_tamper"
            ))),
        }
    }
}
