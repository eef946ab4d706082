//! Worker processes: how the checker starts them (the test binary run again, on one test),
//! and what a worker does — acquire, fenced read-modify-write of the register, release, and
//! report each step to the register before or after it, as the protocol demands.

use std::future::Future;
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lockcore::{LockClient, LockError};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::event::WorkerId;
use super::Mode;

/// Set in a worker's environment to the name of the test that runs it.
pub(crate) const WORKER_VAR: &str = "DISTLOCK_HISTORY_WORKER";
const REGISTER_VAR: &str = "DISTLOCK_HISTORY_REGISTER";
const ID_VAR: &str = "DISTLOCK_HISTORY_ID";
const STORE_VAR: &str = "DISTLOCK_HISTORY_STORE";
const KEY_VAR: &str = "DISTLOCK_HISTORY_KEY";
const TTL_VAR: &str = "DISTLOCK_HISTORY_TTL_MS";
const LIFETIME_VAR: &str = "DISTLOCK_HISTORY_LIFETIME_MS";
const MODE_VAR: &str = "DISTLOCK_HISTORY_MODE";
/// Set (to anything) in the checker's environment to let workers write to stderr.
pub(crate) const VERBOSE_VAR: &str = "DISTLOCK_HISTORY_VERBOSE";

/// What a worker is told through its environment.
#[derive(Clone, Debug)]
pub(crate) struct WorkerConfig {
    pub(crate) register: SocketAddr,
    pub(crate) id: WorkerId,
    pub(crate) store: String,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) lifetime: Duration,
    pub(crate) mode: Mode,
}

impl WorkerConfig {
    /// The configuration of this process if it is a worker of test `test_name`.
    pub(crate) fn from_env(test_name: &str) -> Option<Result<WorkerConfig, String>> {
        let marked = std::env::var(WORKER_VAR).ok()?;
        if marked != test_name {
            return None;
        }
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        let parse = || -> Result<WorkerConfig, String> {
            let num = |name: &str| -> Result<u64, String> {
                var(name)?
                    .parse::<u64>()
                    .map_err(|e| format!("{name}: {e}"))
            };
            Ok(WorkerConfig {
                register: var(REGISTER_VAR)?
                    .parse()
                    .map_err(|e| format!("{REGISTER_VAR}: {e}"))?,
                id: u32::try_from(num(ID_VAR)?).map_err(|e| format!("{ID_VAR}: {e}"))?,
                store: var(STORE_VAR)?,
                key: var(KEY_VAR)?,
                ttl: Duration::from_millis(num(TTL_VAR)?),
                lifetime: Duration::from_millis(num(LIFETIME_VAR)?),
                mode: Mode::parse(&var(MODE_VAR)?).ok_or_else(|| format!("{MODE_VAR}: unknown"))?,
            })
        };
        Some(parse())
    }
}

/// How the checker starts workers.
#[derive(Clone, Debug)]
pub(crate) struct Spawner {
    pub(crate) exe: PathBuf,
    pub(crate) test_name: String,
    pub(crate) config: WorkerConfig,
}

/// A running worker process; killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub(crate) struct WorkerProcess {
    pub(crate) id: WorkerId,
    child: Option<Child>,
}

impl Spawner {
    /// Starts worker `id`: this test binary again, running only this test, in worker mode,
    /// reaching the store at `store`.
    pub(crate) fn spawn(&self, id: WorkerId, store: &str) -> std::io::Result<WorkerProcess> {
        let c = &self.config;
        let mut cmd = Command::new(&self.exe);
        cmd.arg(&self.test_name)
            .args([
                "--exact",
                "--nocapture",
                "--include-ignored",
                "--test-threads=1",
            ])
            .env(WORKER_VAR, &self.test_name)
            .env(REGISTER_VAR, c.register.to_string())
            .env(ID_VAR, id.to_string())
            .env(STORE_VAR, store)
            .env(KEY_VAR, &c.key)
            .env(TTL_VAR, c.ttl.as_millis().to_string())
            .env(LIFETIME_VAR, c.lifetime.as_millis().to_string())
            .env(MODE_VAR, c.mode.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if std::env::var_os(VERBOSE_VAR).is_none() {
            cmd.stderr(Stdio::null());
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent. The
            // worker dies with the thread that spawned it, even while stopped (SIGSTOP):
            // no orphan survives a checker that crashed.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn()?;
        Ok(WorkerProcess {
            id,
            child: Some(child),
        })
    }
}

impl WorkerProcess {
    /// The process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`) to the process.
    pub(crate) fn signal(&self, signal: i32) -> std::io::Result<()> {
        let pid = self
            .pid()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| std::io::Error::other("the worker is not running"))?;
        // SAFETY: kill(2) on the PID of our own unreaped child (it cannot be recycled
        // before we wait for it).
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Kills the process (SIGKILL, which also ends a stopped one) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs this process as worker `config` and exits it: it never returns to the test.
///
/// The worker bounds its own life: it exits when its lifeline connection to the register
/// closes (the checker finished or died) or when `config.lifetime` has passed.
pub(crate) fn worker_main<C, CFut>(config: WorkerConfig, connect: C) -> !
where
    C: Fn(String) -> CFut,
    CFut: Future<Output = Result<LockClient, LockError>>,
{
    let register = config.register;
    std::thread::spawn(move || {
        if let Ok(mut lifeline) = std::net::TcpStream::connect(register) {
            use std::io::Write;
            if lifeline.write_all(b"LIFELINE\n").is_ok() {
                let mut buf = [0u8; 64];
                while matches!(lifeline.read(&mut buf), Ok(n) if n > 0) {}
            }
        }
        std::process::exit(0);
    });
    let lifetime = config.lifetime;
    std::thread::spawn(move || {
        std::thread::sleep(lifetime);
        std::process::exit(0);
    });
    let code = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => match rt.block_on(work(&config, connect)) {
            Ok(()) => 0,
            Err(e) => {
                tracing::warn!(worker = config.id, "history worker stops: {e}");
                eprintln!("history worker {}: {e}", config.id);
                2
            }
        },
        Err(e) => {
            eprintln!("history worker {}: no runtime: {e}", config.id);
            2
        }
    };
    std::process::exit(code)
}

/// The worker's request-answer connection to the register.
struct Conn {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Conn {
    async fn ask(&mut self, request: &str) -> std::io::Result<String> {
        self.write
            .write_all(format!("{request}\n").as_bytes())
            .await?;
        match self.lines.next_line().await? {
            Some(answer) if !answer.starts_with("ERR") => Ok(answer),
            Some(err) => Err(std::io::Error::other(err)),
            None => Err(std::io::Error::other("the register closed the connection")),
        }
    }
}

/// A random number below `n` (at least 1).
fn random_below(n: u64) -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b) % n.max(1)
}

/// A random pause of 1 to `max_ms` milliseconds.
fn jitter(max_ms: u64) -> Duration {
    Duration::from_millis(1 + random_below(max_ms))
}

/// Text on one line (an error's message goes into a one-line protocol).
fn one_line(s: impl std::fmt::Display) -> String {
    s.to_string().replace(['\n', '\r'], " ")
}

async fn work<C, CFut>(config: &WorkerConfig, connect: C) -> std::io::Result<()>
where
    C: Fn(String) -> CFut,
    CFut: Future<Output = Result<LockClient, LockError>>,
{
    let stream = TcpStream::connect(config.register).await?;
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let mut conn = Conn {
        lines: BufReader::new(read).lines(),
        write,
    };
    conn.ask(&format!("HELLO {}", config.id)).await?;
    // The store may be down (a restart in progress): keep trying, reporting each failure.
    let client = loop {
        match connect(config.store.clone()).await {
            Ok(client) => break client,
            Err(e) => {
                conn.ask("INVOKE").await?;
                conn.ask(&format!("FAILED connect: {}", one_line(e)))
                    .await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let wait = config.ttl * 4 + Duration::from_secs(2);
    loop {
        // A writer does the read-modify-write; a reader and a semaphore's holder only read.
        let (request, writer) = match config.mode {
            Mode::Exclusive => (client.lock(config.key.as_str()), true),
            Mode::ReadWrite if random_below(3) == 0 => (client.lock(config.key.as_str()), true),
            Mode::ReadWrite => (client.lock(config.key.as_str()).shared(), false),
            Mode::Semaphore(n) => (client.semaphore(config.key.as_str(), n), false),
        };
        conn.ask("INVOKE").await?;
        let acquired = request.ttl(config.ttl).wait(wait).acquire().await;
        let guard = match acquired {
            Ok(guard) => guard,
            Err(e) => {
                conn.ask(&format!("FAILED {}", one_line(e))).await?;
                tokio::time::sleep(jitter(20)).await;
                continue;
            }
        };
        let token = guard.token().get();
        let lost = guard.lost_token();
        // When lost() fired, for the checker: a loss excuses an overlap only if it came
        // before the other grant.
        let fired = Arc::new(OnceLock::new());
        let watcher = tokio::spawn({
            let (lost, fired) = (lost.clone(), fired.clone());
            async move {
                lost.cancelled().await;
                let _ = fired.set(Instant::now());
            }
        });
        let ago = || {
            fired
                .get()
                .map_or(0, |at: &Instant| at.elapsed().as_micros())
        };
        let claim = guard.claim();
        conn.ask(&format!(
            "ACQUIRED {token} {} {}",
            claim.weight(),
            claim.capacity()
        ))
        .await?;
        // The workload: a fenced read-modify-write with a pause in the middle. It goes on
        // even if `lost()` fired: the fence, not the signal, must keep the register right.
        // Every holder reads (readers and a semaphore's holders too: a fenced read, which
        // may be refused when a newer holder read first); only a writer writes.
        let read = conn.ask(&format!("READ {token}")).await?;
        let mut words = read.split(' ');
        let value = match (words.next(), words.next()) {
            (Some("VALUE"), Some(v)) => v.parse::<u64>().ok(),
            _ => None,
        };
        // The partition nemesis asks its victim to stall past its lease, so that its write
        // comes late (a holder cut off from the store that does not know it yet).
        let stall = match (words.next(), words.next()) {
            (Some("STALL"), Some(ms)) => ms.parse().ok().map(Duration::from_millis),
            _ => None,
        };
        tokio::time::sleep(stall.unwrap_or_else(|| jitter(8))).await;
        if let (true, Some(value)) = (writer, value) {
            conn.ask(&format!("WRITE {token} {}", value.wrapping_add(1)))
                .await?;
        }
        let lost_before = lost.is_cancelled();
        if lost_before {
            conn.ask(&format!("LOST {}", ago())).await?;
        }
        conn.ask("RELEASE").await?;
        let outcome = match guard.release().await {
            Ok(o) => format!("{o:?}"),
            Err(e) => one_line(e),
        };
        // A clean release never fires lost(): if it fired, it did before the release took
        // effect (a timer late in a stall).
        if !lost_before && lost.is_cancelled() {
            conn.ask(&format!("LOST {}", ago())).await?;
        }
        watcher.abort();
        conn.ask(&format!("RELEASED {outcome}")).await?;
        tokio::time::sleep(jitter(5)).await;
    }
}
