//! A loopback TCP proxy that can pause, delay, slow down or cut a client's link to a real
//! store.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::harness::FaultLink;

/// A TCP proxy on `127.0.0.1` in front of one store address, implementing [`FaultLink`]:
/// point one client at [`addr`](Self::addr) and the scenario can pause its traffic (both
/// directions held, then delivered on resume), delay the store's answers (the store
/// applies a request at once; the client hears of it late), hold new connections back
/// before they reach the store, or cut every connection it carries.
///
/// Dropping the proxy closes its listener and every connection through it.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    link: Arc<LinkState>,
    stop: CancellationToken,
}

#[derive(Debug)]
struct LinkState {
    paused: watch::Sender<bool>,
    delay: Mutex<Duration>,
    /// How long a new connection is held back before it reaches the store.
    connect_delay: Mutex<Duration>,
    /// One token per connection the link carries (or is opening), to cut them all.
    conns: Mutex<Vec<CancellationToken>>,
}

impl LinkState {
    fn delay(&self) -> Duration {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn connect_delay(&self) -> Duration {
        *self.connect_delay.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers a new connection's token, forgetting those of closed ones.
    fn track(&self, conn: CancellationToken) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|c| !c.is_cancelled());
        conns.push(conn);
    }

    /// Closes every connection carried so far.
    fn cut(&self) {
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for conn in conns {
            conn.cancel();
        }
    }
}

impl TcpProxy {
    /// Starts a proxy to `upstream` on a free loopback port.
    ///
    /// # Errors
    ///
    /// If no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<TcpProxy> {
        Self::start_at(([127, 0, 0, 1], 0).into(), upstream).await
    }

    /// Starts a proxy to `upstream` listening on `listen`. A store whose nodes tell clients
    /// where to go next (a Redis Cluster's `CLUSTER SLOTS`) can be reached through a proxy
    /// per client this way: a node that names no host for itself sends each client back to
    /// the host it came through, at the node's own port, so a proxy on another loopback
    /// address (`127.0.0.N`) with the node's port keeps the client on it.
    ///
    /// # Errors
    ///
    /// If `listen` cannot be bound.
    pub async fn start_at(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (paused, _) = watch::channel(false);
        let link = Arc::new(LinkState {
            paused,
            delay: Mutex::new(Duration::ZERO),
            connect_delay: Mutex::new(Duration::ZERO),
            conns: Mutex::new(Vec::new()),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, upstream, link.clone(), stop.clone()));
        Ok(TcpProxy { addr, link, stop })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[async_trait]
impl FaultLink for TcpProxy {
    async fn pause(&self) {
        self.link.paused.send_replace(true);
    }

    async fn resume(&self) {
        self.link.paused.send_replace(false);
    }

    async fn delay_answers(&self, delay: Duration) {
        *self.link.delay.lock().unwrap_or_else(|e| e.into_inner()) = delay;
    }

    async fn slow_connects(&self, delay: Duration) -> bool {
        *self
            .link
            .connect_delay
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = delay;
        true
    }

    async fn cut(&self) -> bool {
        self.link.cut();
        true
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    link: Arc<LinkState>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else { continue };
        let link = link.clone();
        let conn = stop.child_token();
        link.track(conn.clone());
        tokio::spawn(async move {
            // Held back before it reaches the store (`slow_connects`); a cut meanwhile
            // closes it. A stopped store refuses the upstream connection; the client sees
            // its connection closed, as it would without the proxy.
            let delay = link.connect_delay();
            let server = tokio::select! {
                _ = conn.cancelled() => return,
                server = async {
                    tokio::time::sleep(delay).await;
                    TcpStream::connect(upstream).await
                } => server,
            };
            let Ok(server) = server else {
                conn.cancel();
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pump(cr, sw, link.clone(), false, conn.clone()));
            tokio::spawn(pump(sr, cw, link, true, conn));
        });
    }
}

/// Copies one direction. Reading never stops (bytes are buffered), so a pause holds
/// messages rather than the sender; answers are delivered in order, each no earlier than
/// its arrival plus the delay in force when it arrived.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    link: Arc<LinkState>,
    answers: bool,
    conn: CancellationToken,
) where
    R: AsyncReadExt + Unpin + Send + 'static,
    W: AsyncWriteExt + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader_conn = conn.clone();
    let reader_link = link.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                _ = reader_conn.cancelled() => break,
                n = from.read(&mut buf) => n,
            };
            match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let delay = if answers {
                        reader_link.delay()
                    } else {
                        Duration::ZERO
                    };
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        // Dropping `tx` lets the writer flush what is queued, then close.
    });
    let mut paused = link.paused.subscribe();
    loop {
        let next = tokio::select! {
            _ = conn.cancelled() => break,
            m = rx.recv() => m,
        };
        let Some((due, bytes)) = next else { break };
        tokio::select! {
            _ = conn.cancelled() => break,
            _ = async {
                tokio::time::sleep_until(due).await;
                let _ = paused.wait_for(|p| !*p).await;
            } => {}
        }
        if to.write_all(&bytes).await.is_err() {
            break;
        }
    }
    conn.cancel();
    let _ = to.shutdown().await;
}
