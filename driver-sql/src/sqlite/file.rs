//! Where SQLite's statements run: the pool of one database file, every error naming the
//! file, writes retried while another connection keeps the database locked, this
//! process's writes to one file taking turns in arrival order, and a check that the file
//! is still the one at its path.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use lockcore::LockError;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::Sqlite;

use super::Lite;
use crate::db::{Ask, Execute};
use crate::dialect::Dialect;
use crate::error::{failure, is_busy, Failure};
use crate::gc::{in_batches, Collect, GcError};
use crate::retry::{retry, BUSY_RETRY};
use crate::run::{Leased, Run};
use crate::store::Call;

/// How errors name the database of `options`.
pub(super) fn database_name(options: &SqliteConnectOptions) -> String {
    format!("SQLite database {}", options.get_filename().display())
}

/// The turn every write of this process to one file waits for (see [`SqliteFile`]).
type WriteTurn = Arc<WriteTurns>;

/// The turns of one file's writes in this process. A write waits in the `lane`, then for
/// the `turn`; a renewal waits for the `turn` only, so it goes ahead of every write still
/// in the lane and waits for one write at most. Behind the lane, a renewal of a hold waited
/// for every queued write: 1,000 tasks of one process taking and releasing locks on one
/// file (0.4 ms a write) held it back past its quarter of the TTL, and a hold of 1 s was
/// lost within a second, although the file answered every statement at once.
#[derive(Debug, Default)]
pub(crate) struct WriteTurns {
    lane: Arc<tokio::sync::Mutex<()>>,
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// A write's turn (and its place in the lane, for a write other than a renewal).
pub(crate) struct Turn {
    _turn: tokio::sync::OwnedMutexGuard<()>,
    _lane: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl WriteTurns {
    /// The turn to write; `renewal`: ahead of the writes in the lane.
    async fn take(&self, renewal: bool) -> Turn {
        let lane = match renewal {
            true => None,
            false => Some(self.lane.clone().lock_owned().await),
        };
        Turn {
            _turn: self.turn.clone().lock_owned().await,
            _lane: lane,
        }
    }
}

/// Why SQLite could not open or write the file at `path` (`e`: its "unable to open
/// database file" or "attempt to write a readonly database"), when the reason is that this
/// user may not read or write the file or its directory: that, naming the path, with the
/// system's error (permission denied, read-only file system) as the source.
pub(super) fn denied(path: &Path, e: &sqlx::Error) -> Option<LockError> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    // Primary result codes: SQLITE_READONLY (8) and SQLITE_CANTOPEN (14), with any
    // extended code above them.
    let code: u32 = db.code()?.parse().ok()?;
    if !matches!(code & 0xff, 8 | 14) {
        return None;
    }
    let refused = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
        )
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let (what, io) = if path.exists() {
        match std::fs::OpenOptions::new().read(true).write(true).open(path) {
            Err(e) if refused(&e) => match std::fs::File::open(path) {
                Err(e) if refused(&e) => (format!("cannot read {}", path.display()), e),
                _ => (format!("cannot write {}", path.display()), e),
            },
            // SQLite also writes `-wal` and `-shm` files beside the database.
            _ => (
                format!(
                    "cannot create files in {}, the directory of the database (its -wal and -shm files live there)",
                    dir?.display()
                ),
                probe_dir(dir?).filter(refused)?,
            ),
        }
    } else {
        (
            format!("cannot create {} in its directory", path.display()),
            probe_dir(dir?).filter(refused)?,
        )
    };
    Some(LockError::backend(Lite::NAME, Denied { what, io }))
}

/// The error creating a file in `dir` gives, if any (the file is removed at once).
fn probe_dir(dir: &Path) -> Option<std::io::Error> {
    let probe = dir.join(format!(".distlock-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(e) => Some(e),
    }
}

/// The database file, or its directory, is not this user's to read or write.
#[derive(Debug)]
struct Denied {
    what: String,
    io: std::io::Error,
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Denied {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.io)
    }
}

/// The write turns of this process, by database file: every backend on one file shares one.
fn write_turn(file: PathBuf) -> WriteTurn {
    static TURNS: OnceLock<Mutex<HashMap<PathBuf, WriteTurn>>> = OnceLock::new();
    let mut turns = TURNS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // Turns nobody uses any more go (a process opening many files in turn).
    turns.retain(|_, turn| Arc::strong_count(turn) > 1);
    turns.entry(file).or_default().clone()
}

/// A SQLite database's pool.
///
/// SQLite lets one connection write at a time, and a connection that finds the file locked
/// sleeps in SQLite's busy handler (up to 100 ms a nap) while a connection that asks again
/// at once gets in: a task that releases a lock and asks again would win every time
/// against this process's own waiters, still asleep. So this process's writes to one file
/// take turns in arrival order ([`tokio::sync::Mutex`] is fair) before they reach SQLite;
/// they lose no concurrency, since SQLite would serialize them anyway. Other processes
/// still meet the busy handler.
#[derive(Debug)]
pub(crate) struct SqliteFile {
    pub(super) pool: SqlitePool,
    /// `SQLite database PATH`: every error names the file.
    name: Arc<str>,
    /// This process's turn to write the file.
    writes: WriteTurn,
    /// The file's path, absolute.
    path: PathBuf,
    /// The file's identity (device and inode) when first seen (see [`moved`](Self::moved)).
    identity: OnceLock<FileId>,
}

/// A file's device and inode numbers.
type FileId = (u64, u64);

/// The identity of the file at `path`; `None` where there is none to read (no such file,
/// an in-memory database, a platform without inodes).
fn file_id(path: &Path) -> std::io::Result<Option<FileId>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some((m.dev(), m.ino()))),
            Err(e) => Err(e),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(None)
    }
}

impl SqliteFile {
    pub(super) fn new(pool: SqlitePool) -> Self {
        let options = pool.connect_options();
        let name = database_name(&options).into();
        let file = options.get_filename();
        let file = std::fs::canonicalize(file).unwrap_or_else(|_| {
            std::env::current_dir()
                .map(|dir| dir.join(file))
                .unwrap_or_else(|_| file.to_path_buf())
        });
        SqliteFile {
            pool,
            name,
            writes: write_turn(file.clone()),
            path: file,
            identity: OnceLock::new(),
        }
    }

    /// Why the file at the database's path is no longer the one this pool opened, if it is
    /// not: deleted, or replaced by another file. The pool's connections keep the old file
    /// open and go on reading and writing it, while every process that opens the path
    /// gets the new one: a second store, where a second holder of the same lock would go
    /// unnoticed. Checked before every statement (one `stat`); the identity is the one
    /// seen at the first.
    pub(crate) fn moved(&self) -> Option<String> {
        let now = match file_id(&self.path) {
            Ok(Some(id)) => id,
            Ok(None) => return None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.identity.get()?;
                return Some(format!(
                    "the SQLite database file {} was deleted after this process opened it: \
                     locks in it are shared with no other process",
                    self.path.display()
                ));
            }
            // Unreadable metadata is no evidence of a new file: the statement will tell.
            Err(_) => return None,
        };
        let first = *self.identity.get_or_init(|| now);
        (first != now).then(|| {
            format!(
                "the SQLite database file {} was replaced by another file after this process \
                 opened it: locks in the old one are shared with no other process",
                self.path.display()
            )
        })
    }

    /// [`moved`](Self::moved) as the error of an operation.
    fn check(&self) -> Result<(), LockError> {
        match self.moved() {
            Some(why) => Err(LockError::backend(Lite::NAME, why)),
            None => Ok(()),
        }
    }

    /// Runs `call` once on a connection of the pool (a write in its turn; a `renewal`
    /// ahead of the other writes).
    async fn once<A: Ask<Sqlite>>(
        &self,
        ask: A,
        call: Call<'_>,
        renewal: bool,
    ) -> Result<A::Answer, sqlx::Error> {
        let _turn = if A::WRITES {
            Some(self.writes.take(renewal).await)
        } else {
            None
        };
        let mut conn = self.pool.acquire().await?;
        ask.run(&mut conn, call).await
    }

    /// Runs `call`, a write again while another connection (this process's or another's)
    /// keeps the database locked past the busy timeout.
    async fn run_in_turn<A: Ask<Sqlite>>(
        &self,
        ask: A,
        call: Call<'_>,
        renewal: bool,
    ) -> Result<A::Answer, LockError> {
        self.check()?;
        let once = move || self.once(ask, call, renewal);
        let result = if A::WRITES {
            retry(&BUSY_RETRY, "sqlite database busy", once, is_busy).await
        } else {
            once().await
        };
        result.map_err(|e| self.error(e))
    }
}

impl Run for SqliteFile {
    type DB = Sqlite;

    /// A write is tried again while another connection (this process's or another's)
    /// keeps the database locked past the busy timeout.
    async fn run<'a, A: Ask<Sqlite>>(
        &'a self,
        ask: A,
        call: Call<'a>,
    ) -> Result<A::Answer, LockError> {
        self.run_in_turn(ask, call, false).await
    }

    /// Ahead of the writes waiting in this process's lane (see [`WriteTurns`]).
    async fn renew<'a, A: Ask<Sqlite>>(
        &'a self,
        ask: A,
        call: Call<'a>,
    ) -> Result<A::Answer, LockError> {
        self.run_in_turn(ask, call, true).await
    }

    /// Each batch a write of its own, so other writers get their turn in between.
    async fn collect<'a>(&'a self, how: Collect, call: Call<'a>) -> Result<u64, GcError> {
        let batch = |()| async move {
            let done = self.run(Execute, call).await?;
            Ok::<_, LockError>(((), done.rows_affected()))
        };
        Ok(in_batches(how, (), batch).await?)
    }

    /// `e`, naming the database file (and saying so when the file or its directory is
    /// not this user's to write).
    fn error(&self, e: sqlx::Error) -> LockError {
        denied(&self.path, &e)
            .unwrap_or_else(|| failure(Lite::NAME, Failure::new(self.name.clone(), e)))
    }

    fn shutdown(&self) -> impl Future<Output = ()> + Send + '_ {
        self.pool.close()
    }

    type Leased<'a> = WriteLease;

    /// The write lock from the first statement on: a deferred transaction that reads
    /// first would fail with "database is locked" when it then writes.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    const TX_RETRY: lockcore::RetryPolicy = BUSY_RETRY;

    /// A connection for a write transaction, with this process's turn to write.
    async fn lease(&self) -> Result<WriteLease, LockError> {
        self.check()?;
        let turn = self.writes.take(false).await;
        let conn = self.pool.acquire().await.map_err(|e| self.error(e))?;
        Ok(WriteLease { conn, _turn: turn })
    }

    fn retryable(e: &sqlx::Error) -> bool {
        is_busy(e)
    }

    fn moved(&self) -> Option<String> {
        SqliteFile::moved(self)
    }
}

/// A pooled connection and this process's turn to write, for one transaction.
pub(crate) struct WriteLease {
    conn: PoolConnection<Sqlite>,
    _turn: Turn,
}

impl Leased<Sqlite> for WriteLease {
    fn conn(&mut self) -> &mut sqlx::SqliteConnection {
        &mut self.conn
    }

    fn settle<T>(self, _: &Result<T, sqlx::Error>) {}
}
