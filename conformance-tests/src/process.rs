//! Starting and stopping real store processes on loopback for fault scenarios.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A free TCP port on `127.0.0.1` for a server a test starts, never handed out twice while
/// this process lives, by this process or by another that uses this function.
///
/// Ports come from below the kernel's ephemeral range, where `bind(0)` (clients, the
/// [`TcpProxy`](crate::TcpProxy)) never lands: a server stopped for a fault scenario can then
/// be restarted on its port without a proxy or another test's server having taken it.
///
/// Two test processes can run at once (two `cargo test` in two terminals). A port is free
/// for `bind` between our check and the server's start, and while a fault scenario has
/// stopped its server: the other process would take it then. So each port handed out is
/// also reserved across processes by an exclusive lock on a file named after it (under the
/// temporary directory), held until this process exits, when the kernel lets go of it.
///
/// # Errors
///
/// If no port can be bound.
pub fn free_port() -> std::io::Result<u16> {
    static HANDED_OUT: Mutex<BTreeMap<u16, Option<File>>> = Mutex::new(BTreeMap::new());
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            r.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let reservations = std::env::temp_dir().join("distlock-test-ports");
    let _ = std::fs::create_dir_all(&reservations);
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let below_ephemeral = 10_000..ephemeral_start.clamp(10_001, 32_768);
    match pick(&reservations, below_ephemeral, &mut handed) {
        Some(port) => Ok(port),
        None => Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()),
    }
}

/// A port of `range`, at random, that is not in `handed`, is not reserved by another
/// process in `dir`, and can be bound; recorded in `handed` with its reservation. `None`
/// after 1000 tries.
fn pick(
    dir: &std::path::Path,
    range: std::ops::Range<u16>,
    handed: &mut BTreeMap<u16, Option<File>>,
) -> Option<u16> {
    let span = range.end.checked_sub(range.start).filter(|&n| n > 0)?;
    for _ in 0..1000 {
        let mut r = [0u8; 2];
        let _ = getrandom::fill(&mut r);
        let port = range.start + u16::from_le_bytes(r) % span;
        if handed.contains_key(&port) {
            continue;
        }
        let Some(reservation) = reserve(dir, port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.insert(port, reservation);
            return Some(port);
        }
    }
    None
}

/// Locks the file of `port` in `dir`: `Some(Some(file))` while this process holds it,
/// `None` if another process does. Without a usable directory nothing is reserved
/// (`Some(None)`): the port is then only checked with `bind`, as within one process.
fn reserve(dir: &std::path::Path, port: u16) -> Option<Option<File>> {
    let Ok(file) = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return Some(None);
    };
    match file.try_lock() {
        Ok(()) => Some(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => None,
        Err(std::fs::TryLockError::Error(_)) => Some(None),
    }
}

/// Whether process `pid` has a socket listening on TCP `port` (from `/proc`; Linux only).
/// A port that answers may belong to someone else: only this tells a server we started
/// from one that was already there.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let mut inodes = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // local_address is ADDR:PORT in hex; state 0A is LISTEN; inode is column 9.
            let listening = cols.get(3) == Some(&"0A");
            let on_port = cols
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok())
                == Some(port);
            if listening && on_port {
                if let Some(inode) = cols.get(9) {
                    inodes.insert(format!("socket:[{inode}]"));
                }
            }
        }
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.contains(&*target.to_string_lossy()))
    })
}

/// A server process started for a test, stopped by PID when dropped (SIGKILL, then reaped).
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    addr: SocketAddr,
    name: String,
}

impl ServerProcess {
    /// Spawns `command` (stdout and stderr discarded unless the command redirects them) and
    /// waits up to `ready_within` until the process itself listens on `addr` and the port
    /// accepts TCP connections. The server must listen from the spawned process (exec, not
    /// fork: `setpriv`/`runuser -u` wrappers that fork are not seen as ready).
    ///
    /// # Errors
    ///
    /// If the process cannot be spawned, exits early, or does not listen in time (it is
    /// killed then).
    pub async fn start(
        mut command: Command,
        addr: SocketAddr,
        ready_within: Duration,
    ) -> std::io::Result<Self> {
        let name = command.get_program().to_string_lossy().into_owned();
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn()?;
        let mut server = ServerProcess {
            child: Some(child),
            addr,
            name,
        };
        let deadline = Instant::now() + ready_within;
        loop {
            // The port must answer *and* be ours: after a restart another process may hold it.
            let ours = server.pid().is_some_and(|pid| listens_on(pid, addr.port()));
            if ours && tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(server);
            }
            if let Some(child) = server.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(std::io::Error::other(format!(
                        "{} exited early: {status}",
                        server.name
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "{} did not listen on {addr} in {ready_within:?}",
                    server.name
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends a signal to the process (e.g. `"STOP"`, `"CONT"`), via `kill(1)`.
    pub fn signal(&self, signal: &str) -> std::io::Result<()> {
        let Some(pid) = self.pid() else {
            return Err(std::io::Error::other("the process is not running"));
        };
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "kill -{signal} {pid} failed: {status}"
            )))
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A directory of its own for a test server's files (an RDB dump, a data directory),
/// removed with everything in it when dropped.
#[derive(Debug)]
pub struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    /// A new empty directory under the system's temp dir, named after `what`.
    ///
    /// # Errors
    ///
    /// If it cannot be created.
    pub fn new(what: &str) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "distlock-{what}-{}",
            &lockcore::driver::OwnerToken::generate().to_hex()[..16]
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(ScratchDir(dir))
    }

    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reserved port is refused to every other holder of its file (a lock taken through
    /// another open file behaves as one taken by another process) until the holder lets go.
    #[test]
    fn a_reserved_port_is_refused_until_let_go() {
        let dir = std::env::temp_dir().join(format!("distlock-ports-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = reserve(&dir, 12_345).expect("free").expect("a file");
        assert!(reserve(&dir, 12_345).is_none(), "reserved twice");
        assert!(
            matches!(reserve(&dir, 12_346), Some(Some(_))),
            "another port refused"
        );
        drop(held);
        assert!(matches!(reserve(&dir, 12_345), Some(Some(_))), "not let go");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ports_are_not_handed_out_twice() {
        let ports: BTreeSet<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        assert_eq!(ports.len(), 50);
    }

    /// `pick` skips a port another process reserved, and one this process handed out.
    #[test]
    fn pick_skips_reserved_and_handed_out_ports() {
        let dir = std::env::temp_dir().join(format!("distlock-pick-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A port nobody listens on now (bind(0) closes it again at once).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let only = port..port + 1;
        let elsewhere = reserve(&dir, port).unwrap().unwrap();
        let mut handed = BTreeMap::new();
        assert_eq!(
            pick(&dir, only.clone(), &mut handed),
            None,
            "reserved elsewhere"
        );
        drop(elsewhere);
        assert_eq!(pick(&dir, only.clone(), &mut handed), Some(port));
        assert_eq!(
            pick(&dir, only.clone(), &mut handed),
            None,
            "handed out twice"
        );
        assert_eq!(pick(&dir, port..port, &mut handed), None, "an empty range");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
