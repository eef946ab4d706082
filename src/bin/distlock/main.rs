//! `distlock`: run a command under a distributed lock.
//!
//! See `distlock --help` and `docs/cli.md`.

mod child;
mod elect;
mod exec;
mod session;
mod signals;
mod spinner;
mod status;
mod terminal;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use distlock::{LockClient, LockError};

/// Exit codes of `distlock` itself (a finished child's own code is passed through).
pub mod codes {
    /// Bad input: an invalid key, TTL or duration, or no command.
    pub const USAGE: u8 = 64;
    /// The lock store could not be reached.
    pub const UNAVAILABLE: u8 = 69;
    /// The store failed in another way, or distlock hit an internal error.
    pub const SOFTWARE: u8 = 70;
    /// This user may not read or write the lock store's file or directory.
    pub const NOPERM: u8 = 77;
    /// The lock is held by someone else (without `--wait`), or `--wait` ran out.
    /// Changeable with `--conflict-exit-code`. `status` answers it for a held key.
    pub const CONFLICT: u8 = 75;
    /// The URL is malformed or names a backend that is not compiled in.
    pub const CONFIG: u8 = 78;
    /// The lock was lost while the command ran (the command was stopped), or distlock could
    /// not confirm that it still held the lock when the command exited.
    pub const LOST: u8 = 79;
    /// The command could not be executed (found but not executable).
    pub const NOT_EXECUTABLE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
    /// Interrupted (SIGINT) while waiting for the lock: 128 + SIGINT.
    pub const INTERRUPTED: u8 = 128 + libc::SIGINT as u8;
    /// Terminated (SIGTERM) while waiting for the lock: 128 + SIGTERM.
    pub const TERMINATED: u8 = 128 + libc::SIGTERM as u8;
}

const AFTER_HELP: &str = "\
Exit codes:
  N        the command ran and exited with N (128+S if it died of signal S)
  64       bad input: a key (or one given twice), TTL, duration, or no command
  69       the lock store could not be reached
  70       the lock store failed otherwise, or an internal error
  75       the lock (with several keys: any of them) is held, or --wait ran out
           (change it with --conflict-exit-code);
           status: the key is held (0: it is free)
  77       permission denied: the lock store's file or directory is not this user's to write
  78       bad URL, a memory: URL, or a backend that is not compiled in
  79       the lock (with several keys: any of them) was lost while the command ran (the
           command was stopped), or it could not be confirmed that it was still held when
           the command exited
  126/127  the command is not executable / was not found
  130/143  interrupted (SIGINT) / terminated (SIGTERM) while waiting for the lock";

/// What `--url` accepts; the default is added at run time.
const URL_HELP: &str = "The lock store every process sharing a lock must use: sqlite:PATH, \
redis://HOST/, postgres://..., mysql://..., etcd://..., zk://..., redlock://... (not memory:, \
which each process would have to itself)";

/// Run commands under a distributed lock, with fencing tokens and lease renewal.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, after_help = AFTER_HELP)]
struct Cli {
    /// The lock store (see URL_HELP, which replaces this at run time).
    #[arg(long, env = "DISTLOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,

    /// No progress output.
    #[arg(long, short, global = true)]
    quiet: bool,

    /// Say on stderr which lock store is used, and when the lock is taken and released.
    #[arg(long, short, global = true, conflicts_with = "quiet")]
    verbose: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Acquire KEY (several KEYs: all of them or none), run COMMAND while renewing the lock,
    /// release it when COMMAND exits.
    ///
    /// Several KEYs are taken in one order whatever the order given, so that overlapping
    /// sets never wait for each other in a circle; --wait bounds the whole set, and if any
    /// KEY is lost the command is stopped. With one KEY the command gets DISTLOCK_KEY and
    /// DISTLOCK_FENCING_TOKEN in its environment (pass the token with every write the lock
    /// protects); for each KEY, in the order given, DISTLOCK_KEY_<n> and
    /// DISTLOCK_FENCING_TOKEN_<n>, n from 1 to DISTLOCK_KEY_COUNT (with several KEYs only
    /// those). It runs as the leader of its own process group, which is the terminal's
    /// foreground group while it runs if distlock was (so it can prompt). SIGINT, SIGTERM,
    /// SIGHUP and SIGQUIT sent to distlock go to the whole group, which gets SIGKILL if it
    /// has not exited `--kill-after` later; a stopped command is reported and continued.
    /// While the command has the terminal, distlock is in its group too, so that Ctrl-C
    /// typed there ends it the same way, within `--kill-after` (a distlock that leads its
    /// session, as `exec distlock` makes it, cannot change its group: it runs a second
    /// distlock process that does it all, and passes signals on to it). If distlock dies,
    /// even by SIGKILL, the command is killed with it. If the lock cannot be renewed, the
    /// command gets SIGTERM no later than `--kill-after` before the lease ends, then
    /// SIGKILL before it ends.
    // The usage is spelled out: clap's own shows `--url <URL>` as if it were required
    // whenever DISTLOCK_URL is set.
    #[command(
        after_help = AFTER_HELP,
        override_usage = "distlock exec [OPTIONS] <KEY>... -- <COMMAND> [ARGS]..."
    )]
    Exec(exec::ExecArgs),
    /// Show who holds each KEY: every holder's label, mode (exclusive, shared, permits),
    /// fencing token and remaining TTL, and a semaphore's permits in use.
    #[command(override_usage = "distlock status [OPTIONS] <KEY>...")]
    Status {
        /// The lock names.
        #[arg(required = true, num_args = 1.., value_name = "KEY")]
        keys: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run COMMAND while this process leads the election KEY: wait to lead (as long as it
    /// takes, or --wait), publish --value for `distlock leader`, run COMMAND, and step down
    /// when it exits. As with `exec`, COMMAND gets DISTLOCK_KEY and DISTLOCK_FENCING_TOKEN
    /// (the term: pass it with every write the leader makes) and is stopped if leadership is
    /// lost. Elections are locks: `status KEY` shows the leader too.
    #[command(
        after_help = AFTER_HELP,
        override_usage = "distlock elect [OPTIONS] <KEY> -- <COMMAND> [ARGS]..."
    )]
    Elect(elect::ElectArgs),
    /// Show who leads the election KEY: the value it published, its term and lease; with
    /// --watch, a line per change (a new leader, or none) until interrupted.
    #[command(override_usage = "distlock leader [OPTIONS] <KEY>")]
    Leader {
        /// The election's name.
        key: String,
        /// Follow changes until interrupted.
        #[arg(long)]
        watch: bool,
        /// Print JSON (one object per line with --watch).
        #[arg(long)]
        json: bool,
    },
    /// Break a lock whoever holds it (operator use only).
    #[command(override_usage = "distlock release --force [OPTIONS] <KEY>")]
    Release {
        /// Required: breaking a lock is unsafe for the holder, which is not told.
        #[arg(long)]
        force: bool,
        /// The lock name.
        key: String,
    },
}

/// A failure of distlock itself: one line for stderr and an exit code.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// The exit code and line for a lock error.
    fn from_lock_error(e: &LockError, context: &str) -> Self {
        let code = match e {
            LockError::InvalidKey { .. } | LockError::InvalidTtl { .. } => codes::USAGE,
            LockError::Config { .. } => codes::CONFIG,
            LockError::Unavailable { .. } | LockError::QuorumNotReached { .. } => {
                codes::UNAVAILABLE
            }
            LockError::Timeout { .. } => codes::CONFLICT,
            LockError::Lost { .. } | LockError::NotHeld { .. } => codes::LOST,
            _ if denied(e) => codes::NOPERM,
            _ => codes::SOFTWARE,
        };
        let mut message = format!("{context}: {e}");
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            let text = s.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = s.source();
        }
        if code == codes::NOPERM {
            message.push_str(&format!("; {DENIED_HINT}"));
        }
        Failure::new(code, message)
    }
}

/// What to do about a store this user may not write.
const DENIED_HINT: &str = "use a store this user can write (--url or DISTLOCK_URL)";

/// Whether `e` comes from the system refusing this user a file or directory of the store
/// (permission denied, read-only file system).
fn denied(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            ) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

/// The default store: a SQLite file in the user's state directory.
fn default_url() -> String {
    let dir = dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .unwrap_or_else(std::env::temp_dir)
        .join("distlock");
    format!("sqlite:{}", default_db(dir).display())
}

fn default_db(dir: PathBuf) -> PathBuf {
    dir.join("locks.sqlite3")
}

async fn connect(url: &str, label: Option<&str>) -> Result<LockClient, Failure> {
    if url.trim().is_empty() {
        return Err(Failure::new(
            codes::CONFIG,
            "the lock store URL is empty: give --url (or DISTLOCK_URL) a URL such as \
             sqlite:PATH or redis://HOST/, or leave both out for the default store",
        ));
    }
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    if scheme.as_deref() == Some("memory") {
        return Err(Failure::new(
            codes::CONFIG,
            "memory: cannot be used by the distlock command: each process would get a store of \
             its own, so the lock would keep out no other process; use a SQLite file \
             (sqlite:PATH, the default) or a server's URL",
        ));
    }
    let url = &sqlite_home(url)?;
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.trim_start_matches("//");
        let path = path.split('?').next().unwrap_or(path);
        if let Some(dir) = std::path::Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            // Only the default store's directory is made: a mistyped path must not quietly
            // become a second store that excludes nobody.
            if *url == default_url() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    let (code, hint) = if denied(&e) {
                        (codes::NOPERM, format!("; {DENIED_HINT}"))
                    } else {
                        (codes::CONFIG, String::new())
                    };
                    Failure::new(
                        code,
                        format!(
                            "cannot create {}, the default lock store's directory: {e}{hint}",
                            dir.display()
                        ),
                    )
                })?;
            } else if !dir.is_dir() {
                return Err(Failure::new(
                    codes::CONFIG,
                    format!(
                        "the lock store {} is in {}, which does not exist: check the path, or \
                         create the directory first (distlock makes only its default store's)",
                        distlock::redact(url),
                        dir.display()
                    ),
                ));
            }
        }
    }
    let backend = distlock::connect_backend(url).await.map_err(|e| {
        Failure::from_lock_error(
            &e,
            &format!("cannot use the lock store {}", distlock::redact(url)),
        )
    })?;
    let mut builder = LockClient::builder(backend);
    if let Some(label) = label {
        builder = builder.label(label);
    }
    Ok(builder.build())
}

/// The store `url` names, as shown to people: redacted, a SQLite path's `~/` expanded.
fn shown_store(url: &str) -> String {
    distlock::redact(&sqlite_home(url).unwrap_or_else(|_| url.to_owned()))
}

/// `url` with a SQLite path's leading `~/` made the home directory, as a shell would have
/// (a `~` that reached distlock unexpanded, in a quoted URL or an environment variable,
/// otherwise names a directory called `~`). `~user/` is refused.
fn sqlite_home(url: &str) -> Result<String, Failure> {
    let Some(path) = url.strip_prefix("sqlite:") else {
        return Ok(url.to_owned());
    };
    let (slashes, path) = match path.strip_prefix("//") {
        Some(rest) => ("//", rest),
        None => ("", path),
    };
    if !path.starts_with('~') {
        return Ok(url.to_owned());
    }
    let Some(rest) = path.strip_prefix("~/") else {
        return Err(Failure::new(
            codes::CONFIG,
            format!(
                "the lock store {} starts with `~`, which distlock expands only as `~/` (your \
                 home directory): write the path out",
                distlock::redact(url)
            ),
        ));
    };
    let home = dirs::home_dir().ok_or_else(|| {
        Failure::new(
            codes::CONFIG,
            "the lock store's path starts with `~/`, but there is no home directory to expand \
             it to: write the path out",
        )
    })?;
    Ok(format!("sqlite:{slashes}{}", home.join(rest).display()))
}

fn format_ttl(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
        None => "unknown".into(),
    }
}

async fn run(cli: Cli, url: String) -> Result<u8, Failure> {
    match cli.command {
        Command::Exec(args) => exec::run(args, &url, cli.quiet, cli.verbose).await,
        Command::Elect(args) => elect::run(args, &url, cli.quiet, cli.verbose).await,
        Command::Leader { key, watch, json } => {
            let client = connect(&url, None).await?;
            elect::leader(&client, &key, watch, json).await
        }
        Command::Status { keys, json } => {
            let client = connect(&url, None).await?;
            status::run(&client, &keys, json, &shown_store(&url)).await
        }
        Command::Release { force, key } => {
            if !force {
                return Err(Failure::new(
                    codes::USAGE,
                    "release breaks a lock whoever holds it; pass --force if that is what you want",
                ));
            }
            let client = connect(&url, None).await?;
            eprintln!(
                "distlock: warning: breaking {key}: its holder is not told and may still be running; \
                 only fencing tokens keep its late writes out"
            );
            let outcome = client
                .force_release(&key)
                .await
                .map_err(|e| Failure::from_lock_error(&e, "cannot break the lock"))?;
            match outcome {
                distlock::ReleaseOutcome::Released => println!("{key}: released"),
                _ => println!("{key}: was not held"),
            }
            Ok(0)
        }
    }
}

/// Where the command goes, for `distlock exec KEY COMMAND…` typed without `--` (clap then
/// reports the command as an unexpected argument, or, as `exec` takes several keys, as
/// more keys and no command, neither of which says what to do).
fn dash_dash_tip(args: &[String]) -> Option<String> {
    let sub = args
        .iter()
        .skip(1)
        .find(|a| *a == "exec" || *a == "elect")?;
    if args.iter().any(|a| a == "--") {
        return None;
    }
    let keys = if sub == "exec" { "KEY..." } else { "KEY" };
    Some(format!(
        "the command goes after `--`: distlock {sub} [OPTIONS] {keys} -- COMMAND [ARGS]..."
    ))
}

fn main() -> ExitCode {
    // First, while distlock has one thread: it changes the environment.
    session::adopt();
    let url_help = format!("{URL_HELP} [default: {}]", default_url());
    let command = Cli::command().mut_arg("url", |a| a.help(url_help));
    let cli = match command
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(mut e) => {
            let code = if e.use_stderr() { codes::USAGE } else { 0 };
            if matches!(
                e.kind(),
                clap::error::ErrorKind::UnknownArgument
                    | clap::error::ErrorKind::MissingRequiredArgument
            ) {
                let args: Vec<String> = std::env::args().collect();
                if let Some(tip) = dash_dash_tip(&args) {
                    e.insert(
                        clap::error::ContextKind::Suggested,
                        clap::error::ContextValue::StyledStrs(vec![tip.into()]),
                    );
                }
            }
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // A session leader cannot join its command's group to hear Ctrl-C: it runs `exec` in a
    // worker that can, and waits for it. Before the runtime and its threads exist.
    if matches!(cli.command, Command::Exec(_) | Command::Elect(_)) {
        if let Some(code) = session::supervise() {
            return ExitCode::from(code);
        }
    }
    // Colour only on a terminal, and not when NO_COLOR (https://no-color.org) asks.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DISTLOCK_LOG"))
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
    let url = cli.url.clone().unwrap_or_else(default_url);
    // One thread: the child is spawned from it, and PR_SET_PDEATHSIG is tied to the thread
    // that spawned the child, so it must live as long as distlock does.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock: cannot start: {e}");
            return ExitCode::from(codes::SOFTWARE);
        }
    };
    let outcome = runtime.block_on(run(cli, url.clone()));
    runtime.shutdown_timeout(Duration::from_secs(1));
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            // Messages never carry a secret: URLs are only ever shown redacted (by parsing,
            // in lockcore::store_url), and drivers hand passwords to their clients apart
            // from the URL. No text replacement here: it would mangle words that happen to
            // equal the password.
            eprintln!("distlock: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
