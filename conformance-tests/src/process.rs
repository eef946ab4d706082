//! Starting and stopping real store processes on loopback for fault scenarios.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on `127.0.0.1` (bound, then released for the server to take).
///
/// # Errors
///
/// If no loopback port can be bound.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
    /// waits up to `ready_within` for `addr` to accept TCP connections.
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
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
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
