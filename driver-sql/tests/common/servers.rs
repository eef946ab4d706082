//! Database servers of their own for fault scenarios: PostgreSQL and MariaDB started on a
//! free loopback port with data in a temp dir, stopped by the server's own PID.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use conformance_tests::process::{free_port, ServerProcess};

/// The URL of a shared test server from the environment, or a failure saying how to get one.
pub fn shared_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{var} is not set: run `scripts/servers.sh start` and `source target/test-servers.env` (or use scripts/test.sh)"),
    }
}

/// A temp dir owned by `user`, removed when dropped.
pub struct ServerDir(pub PathBuf);

impl ServerDir {
    pub fn new(kind: &str, user: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("distlock-{kind}-{}", super::random_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("chown").arg(user).arg(&dir).status().unwrap();
        assert!(status.success(), "chown {user} {}", dir.display());
        ServerDir(dir)
    }
}

impl Drop for ServerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie (reaped late by PID 1) counts as gone.
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Signals the server whose PID is the first line of `pid_file` and waits until it is gone.
fn stop_by_pid_file(pid_file: &Path, signal: &str) {
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return;
    };
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<u32>().ok())
    else {
        return;
    };
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pid_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if pid_alive(pid) {
        let _ = Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string())
            .status();
    }
}

/// A server of one of the two kinds, restartable at the same address.
pub struct OwnServer {
    kind: Kind,
    dir: ServerDir,
    port: u16,
    process: Mutex<Option<ServerProcess>>,
    /// The file libfaketime reads the server's clock offset from, if its clock is steered.
    clock: Option<PathBuf>,
}

/// The file a steered server's libfaketime reads its clock offset from, in `dir`, at +0.
fn clock_file(dir: &ServerDir) -> PathBuf {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: apt-get install libfaketime (scripts/servers.sh start \
         installs it)"
    );
    let file = dir.0.join("clock");
    std::fs::write(&file, "+0\n").unwrap();
    file
}

/// Where Debian's libfaketime lives (package `libfaketime`, installed by
/// `scripts/servers.sh`).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[derive(Clone, Copy)]
enum Kind {
    Postgres,
    MariaDb,
}

impl OwnServer {
    /// A fresh PostgreSQL cluster (trust auth on loopback; user and database `postgres`).
    pub async fn postgres() -> Self {
        Self::postgres_with_clock(false).await
    }

    /// A fresh PostgreSQL cluster whose wall clock [`set_clock`](Self::set_clock) can step
    /// when `steered` (libfaketime, preloaded; its monotonic clock is left alone).
    pub async fn postgres_with_clock(steered: bool) -> Self {
        let dir = ServerDir::new("pg", "postgres");
        copy_template(Kind::Postgres, &dir.0.join("data"));
        let clock = steered.then(|| clock_file(&dir));
        let server = OwnServer {
            kind: Kind::Postgres,
            dir,
            port: free_port().unwrap(),
            process: Mutex::new(None),
            clock,
        };
        server.start().await;
        server
    }

    /// A fresh MariaDB (root over the socket; a `distlock` user on loopback).
    pub async fn mariadb() -> Self {
        Self::mariadb_with_clock(false).await
    }

    /// A fresh MariaDB whose wall clock [`set_clock`](Self::set_clock) can step when
    /// `steered` (libfaketime, preloaded; its monotonic clock is left alone).
    pub async fn mariadb_with_clock(steered: bool) -> Self {
        let dir = ServerDir::new("mariadb", "mysql");
        copy_template(Kind::MariaDb, &dir.0.join("data"));
        let clock = steered.then(|| clock_file(&dir));
        let server = OwnServer {
            kind: Kind::MariaDb,
            dir,
            port: free_port().unwrap(),
            process: Mutex::new(None),
            clock,
        };
        server.start().await;
        let sql = "CREATE DATABASE distlock; \
                   CREATE USER 'distlock'@'127.0.0.1' IDENTIFIED BY 'distlock'; \
                   GRANT ALL ON *.* TO 'distlock'@'127.0.0.1' WITH GRANT OPTION;";
        let status = Command::new("mariadb")
            .arg(format!("--socket={}", server.dir.0.join("sock").display()))
            .args(["-u", "root", "-e", sql])
            .status()
            .unwrap();
        assert!(status.success(), "creating the distlock user failed");
        server
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A URL reaching the server through `addr` (the server's own or a proxy's).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        match self.kind {
            Kind::Postgres => format!("postgres://postgres@{addr}/postgres"),
            Kind::MariaDb => format!("mysql://distlock:distlock@{addr}/distlock"),
        }
    }

    /// Sets the server's wall clock to the real time plus `offset_ms`, for every session
    /// (libfaketime reads the file at each clock call). Panics for a server started without
    /// a steered clock.
    pub fn set_clock(&self, offset_ms: i64) {
        let file = self
            .clock
            .as_ref()
            .expect("a server started with a steered clock");
        let text = format!("{:+.3}\n", offset_ms as f64 / 1000.0);
        // Written whole, then renamed: a clock call never reads half a line.
        let tmp = file.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, file).unwrap();
    }

    /// Whether [`set_clock`](Self::set_clock) can step this server's clock.
    pub fn steered(&self) -> bool {
        self.clock.is_some()
    }

    fn pid_file(&self) -> PathBuf {
        match self.kind {
            Kind::Postgres => self.dir.0.join("data").join("postmaster.pid"),
            Kind::MariaDb => self.dir.0.join("pid"),
        }
    }

    pub async fn start(&self) {
        // Both exec the server itself (no forking wrapper), so the child's PID is the
        // server's: dropping the ServerProcess kills the server, not a bystander.
        let command = match self.kind {
            Kind::Postgres => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=postgres", "--regid=postgres", "--init-groups"]);
                if let Some(file) = &self.clock {
                    // Preloaded into the server only, through `env` (which execs it, so
                    // the PID stays the server's): preloaded into setpriv too, libfaketime
                    // would hand the server a semaphore of root's it may not open.
                    c.arg("env")
                        .arg(format!("LD_PRELOAD={LIBFAKETIME}"))
                        .arg(format!("FAKETIME_TIMESTAMP_FILE={}", file.display()))
                        .arg("FAKETIME_NO_CACHE=1")
                        .arg("FAKETIME_DONT_FAKE_MONOTONIC=1");
                }
                c.arg(pg_bin_dir().join("postgres"))
                    .arg("-D")
                    .arg(self.dir.0.join("data"))
                    .args([
                        "-c",
                        "listen_addresses=127.0.0.1",
                        "-p",
                        &self.port.to_string(),
                    ])
                    .arg("-k")
                    .arg(&self.dir.0)
                    .args([
                        "-c",
                        "fsync=off",
                        "-c",
                        "synchronous_commit=off",
                        "-c",
                        "full_page_writes=off",
                    ])
                    .args(["-c", "max_connections=200"]);
                c
            }
            Kind::MariaDb => {
                let mut c = Command::new(mariadbd());
                if let Some(file) = &self.clock {
                    // MariaDB drops to its user itself, in the same process: libfaketime's
                    // state stays its own.
                    c.env("LD_PRELOAD", LIBFAKETIME)
                        .env("FAKETIME_TIMESTAMP_FILE", file)
                        .env("FAKETIME_NO_CACHE", "1")
                        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
                }
                c.arg("--no-defaults")
                    .arg("--user=mysql")
                    .arg(format!("--datadir={}", self.dir.0.join("data").display()))
                    // Temporary tables in the server's own directory, not the shared /tmp.
                    .arg(format!("--tmpdir={}", self.dir.0.display()))
                    .arg("--bind-address=127.0.0.1")
                    .arg(format!("--port={}", self.port))
                    .arg(format!("--socket={}", self.dir.0.join("sock").display()))
                    .arg(format!("--pid-file={}", self.pid_file().display()))
                    .args([
                        "--skip-log-bin",
                        "--skip-name-resolve",
                        "--innodb-flush-log-at-trx-commit=0",
                    ])
                    .args(["--innodb-doublewrite=0", "--max-connections=300"])
                    .args(["--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M"]);
                c
            }
        };
        let process = ServerProcess::start(command, self.addr(), Duration::from_secs(30))
            .await
            .unwrap();
        *self.process.lock().unwrap() = Some(process);
        if matches!(self.kind, Kind::Postgres) {
            self.wait_for_sessions(Duration::from_secs(30)).await;
        }
    }

    /// Waits until PostgreSQL accepts sessions: it listens before its startup (recovery
    /// after a fast shutdown included) has finished, and until then refuses every session
    /// with "the database system is starting up".
    async fn wait_for_sessions(&self, bound: Duration) {
        let (dir, port) = (self.dir.0.clone(), self.port);
        tokio::task::spawn_blocking(move || {
            let until = Instant::now() + bound;
            loop {
                let ready = Command::new(pg_bin_dir().join("pg_isready"))
                    .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                    .status()
                    .unwrap()
                    .success();
                if ready {
                    return;
                }
                assert!(
                    Instant::now() < until,
                    "PostgreSQL in {} refused sessions for {bound:?} after it listened",
                    dir.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
        .unwrap();
    }

    /// Stops the server by its own PID, with its fast-shutdown signal.
    pub async fn stop(&self) {
        let pid_file = self.pid_file();
        // Fast shutdown: PostgreSQL on SIGINT, MariaDB on SIGTERM.
        let signal = match self.kind {
            Kind::Postgres => "INT",
            Kind::MariaDb => "TERM",
        };
        let process = self.process.lock().unwrap().take();
        tokio::task::spawn_blocking(move || {
            stop_by_pid_file(&pid_file, signal);
            drop(process);
        })
        .await
        .unwrap();
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        stop_by_pid_file(&self.pid_file(), "KILL");
    }
}

/// A data directory made once per test process (by initdb / mariadb-install-db, which are
/// slow and do not like running side by side), copied for every server.
fn copy_template(kind: Kind, dest: &Path) {
    static MADE: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let (name, user) = match kind {
        Kind::Postgres => ("pg-template", "postgres"),
        Kind::MariaDb => ("mariadb-template", "mysql"),
    };
    // Kept between runs under cargo's temp dir for integration tests.
    let template = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("distlock-sql-{name}"));
    if !template.join("data").exists() {
        let staging = ServerDir::new(name, user);
        let data = staging.0.join("data");
        let log = staging.0.join("init.log");
        let mut command = match kind {
            Kind::Postgres => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
                    .arg(pg_bin_dir().join("initdb"))
                    .arg("-D")
                    .arg(&data)
                    .args([
                        "-U",
                        "postgres",
                        "--auth-local=trust",
                        "--auth-host=trust",
                        "-E",
                        "UTF8",
                        "--locale=C.UTF-8",
                    ]);
                c
            }
            Kind::MariaDb => {
                let mut c = Command::new(mariadb_install_db());
                c.arg("--no-defaults")
                    .arg("--user=mysql")
                    .arg(format!("--datadir={}", data.display()))
                    .args([
                        "--auth-root-authentication-method=socket",
                        "--skip-test-db",
                        "--innodb-log-file-size=8M",
                    ]);
                c
            }
        };
        let out = std::fs::File::create(&log).unwrap();
        let status = command
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "{name}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let _ = std::fs::remove_dir_all(&template);
        std::fs::create_dir_all(&template).unwrap();
        let status = Command::new("cp")
            .arg("-a")
            .arg(&data)
            .arg(&template)
            .status()
            .unwrap();
        assert!(status.success(), "saving the {name}");
    }
    let status = Command::new("cp")
        .arg("-a")
        .arg(template.join("data"))
        .arg(dest)
        .status()
        .unwrap();
    assert!(status.success(), "copying the {} template", dest.display());
}

fn pg_bin_dir() -> PathBuf {
    std::env::var_os("DISTLOCK_PG_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

fn mariadbd() -> PathBuf {
    std::env::var_os("DISTLOCK_MARIADBD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/mariadbd"))
}

fn mariadb_install_db() -> PathBuf {
    PathBuf::from("mariadb-install-db")
}
