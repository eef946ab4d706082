//! The backend's one ZooKeeper session: every hold's lease. Its heartbeats (sent by the
//! client library) keep every ephemeral node of the backend alive at once, so renewal
//! traffic does not grow with the number of holds. When the servers declare it expired,
//! every node it created is gone; the next operation opens a new session.

use std::future::Future;

use lockcore::LockError;
use tokio::sync::Mutex;
use zookeeper_client::{Acls, Client, CreateMode, SessionId, SessionState};

use crate::capabilities::NAME;
use crate::config::ZkConfig;
use crate::error::{timed_out, to_lock_error};

/// The session and what opening one needs.
pub(crate) struct Session {
    cfg: ZkConfig,
    /// The client of the current session; replaced once that session is gone.
    current: Mutex<Option<Client>>,
}

impl Session {
    pub fn new(cfg: ZkConfig) -> Self {
        Session {
            cfg,
            current: Mutex::new(None),
        }
    }

    pub fn cfg(&self) -> &ZkConfig {
        &self.cfg
    }

    /// The ACL of the nodes the driver creates: its user's alone when it authenticates.
    pub fn acls(&self) -> Acls<'static> {
        if self.cfg.user.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// The client of a live session, opening one (and the root path) if there is none.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when no server answers within the connect timeout;
    /// [`LockError::Backend`] for refused credentials or a root path the ACL forbids.
    pub async fn client(&self) -> Result<Client, LockError> {
        let mut current = self.current.lock().await;
        if let Some(client) = current.as_ref() {
            if !client.state().is_terminated() {
                return Ok(client.clone());
            }
        }
        *current = None;
        let client = self.connect().await?;
        let root = self.cfg.root.clone();
        // An existing root is taken as it is (reading its stat needs no right): creating it
        // again would need the right to create in its parent, which another user's ACL may
        // refuse even though the root itself is ours to use.
        self.run("creating the root path", &root, async {
            if client.check_stat(&root).await?.is_some() {
                return Ok(());
            }
            client
                .mkdir(&root, &CreateMode::Persistent.with_acls(self.acls()))
                .await
        })
        .await?;
        *current = Some(client.clone());
        Ok(client)
    }

    /// The current session's client without opening one, if it is not known to be gone.
    pub async fn current(&self) -> Option<Client> {
        let current = self.current.lock().await;
        current
            .as_ref()
            .filter(|c| !c.state().is_terminated())
            .cloned()
    }

    /// Closes the session: its nodes go at once instead of at its timeout.
    pub async fn close(&self) {
        if let Some(client) = self.current.lock().await.take() {
            // The last handle dropped closes the session (it is not detached).
            drop(client);
        }
    }

    async fn connect(&self) -> Result<Client, LockError> {
        let cfg = &self.cfg;
        let place = cfg.place();
        let mut connector = Client::connector()
            .with_session_timeout(cfg.session_timeout)
            .with_fail_eagerly();
        if let Some(t) = cfg.connection_timeout {
            connector = connector.with_connection_timeout(t);
        }
        if let (Some(user), Some(password)) = (&cfg.user, &cfg.password) {
            let secret = lockcore::store_url::ExposeSecret::expose_secret(password);
            connector = connector.with_auth("digest", format!("{user}:{secret}").as_bytes());
        }
        let connecting = async {
            if cfg.tls {
                secure_connect(connector, cfg).await
            } else {
                connector.connect(&place).await.map_err(|e| match e {
                    // Every server refused the connection: nothing was sent.
                    zookeeper_client::Error::NoHosts => LockError::unavailable_unsent(
                        NAME,
                        "no ZooKeeper server accepted a connection",
                    )
                    .at(&place),
                    e => to_lock_error(e, "/", &place),
                })
            }
        };
        tokio::time::timeout(cfg.connect_timeout, connecting)
            .await
            .map_err(|_| timed_out("opening a session", &place))?
    }

    /// `op` bounded by the operation timeout, its error as a [`LockError`] about `path`.
    pub async fn run<T>(
        &self,
        what: &str,
        path: &str,
        op: impl Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.cfg.timeout, op).await {
            Ok(result) => result.map_err(|e| to_lock_error(e, path, &self.cfg.place())),
            Err(_) => Err(timed_out(what, &self.cfg.place())),
        }
    }
}

/// Whether `client`'s session is `id` and may still be alive.
pub(crate) fn same_session(client: &Client, id: SessionId) -> bool {
    client.session_id() == id && !matches!(client.state(), SessionState::Expired)
}

#[cfg(feature = "tls")]
async fn secure_connect(
    connector: zookeeper_client::Connector,
    cfg: &ZkConfig,
) -> Result<Client, LockError> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map_err(|e| LockError::config(format!("cannot read the TLS file {path}: {e}")))
    };
    let bad = |e: zookeeper_client::Error| LockError::config(format!("ZooKeeper TLS: {e}"));
    // rustls needs a process-wide crypto provider when more than one is compiled in (another
    // driver may bring ring): install aws-lc-rs, which this client's TLS is built with,
    // unless the application installed one already. Without it the handshake panics.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut options = zookeeper_client::TlsOptions::new();
    if let Some(ca) = &cfg.ca {
        options = options.with_pem_ca(&read(ca)?).map_err(bad)?;
    }
    if let Some((cert, key)) = &cfg.identity {
        options = options
            .with_pem_identity(&read(cert)?, &read(key)?)
            .map_err(bad)?;
    }
    connector
        .with_tls(options)
        .secure_connect(&cfg.place())
        .await
        .map_err(|e| to_lock_error(e, "/", &cfg.place()))
}

#[cfg(not(feature = "tls"))]
async fn secure_connect(
    _connector: zookeeper_client::Connector,
    _cfg: &ZkConfig,
) -> Result<Client, LockError> {
    Err(LockError::config(
        "TLS to ZooKeeper (zks:// or tls=true) needs driver-zookeeper's `tls` feature \
         (distlock's `zookeeper-tls`)",
    ))
}
