//! `distlock exec`: acquire, run, renew, stop the child if the lock is lost, release.

use std::future::Future;
use std::io::IsTerminal;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use distlock::{
    FencingToken, LockClient, LockError, LockGuard, LockKey, MultiLockGuard, ReleaseOutcome,
    RenewalHealth,
};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::spinner;
use crate::status::{held_lines, holder_line, set_holder_line, unlisted_holds, Form};
use crate::{child, codes, connect, session, signals, terminal, Failure};

/// How long distlock waits for the release after the command exited.
const RELEASE_LIMIT: Duration = Duration::from_secs(3);

/// Parses `500ms`, `30s`, `5m`, `1h 30m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    use humantime::DurationError;
    humantime::parse_duration(s).map_err(|e| match e {
        // Names the unit it did not know and lists the ones it does.
        DurationError::UnknownUnit { .. } => e.to_string(),
        DurationError::NumberOverflow => "too large".into(),
        // "expected number at 0" and the like point at a position nobody counts.
        _ => "not a duration (use e.g. 500ms, 30s, 5m, 1h 30m)".into(),
    })
}

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// Lease time-to-live; renewed every TTL/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// Wait up to this long for a held lock (for several keys: for the whole set). Without
    /// it a held lock means: do not run, exit with the conflict code (75).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) wait: Option<Duration>,

    /// If renewals fail, send SIGTERM this long before the lease ends, and SIGKILL before
    /// it ends; after a signal to distlock (Ctrl-C, SIGTERM) that the command has not ended
    /// on, SIGKILL this long after it. Default: a third of the TTL, at most 10s; must be
    /// under half the TTL.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) kill_after: Option<Duration>,

    /// Exit code when the lock is held (or --wait runs out), as flock's -E.
    #[arg(long, default_value_t = codes::CONFLICT)]
    pub(crate) conflict_exit_code: u8,

    /// The holder label others see in `distlock status` (default: host/pid).
    #[arg(long)]
    pub(crate) label: Option<String>,

    /// Take a shared (read) lock: `--shared` commands on KEY run side by side, and an
    /// `exec` without it on the same KEY (the writer) runs alone. A waiting writer is not
    /// starved: shared commands that start after it wait for it.
    #[arg(long, conflicts_with = "limit")]
    pub(crate) shared: bool,

    /// Run at most N commands at once on KEY across every machine using the store (a
    /// semaphore of N, as `consul lock -n`). Every command on KEY must pass the same N.
    /// One KEY only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..u32::MAX as i64))]
    pub(crate) limit: Option<u32>,

    /// The lock name; several names are taken together, all or nothing.
    #[arg(required = true, num_args = 1.., value_name = "KEY")]
    pub(crate) keys: Vec<String>,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    pub(crate) command: Vec<String>,

    /// `distlock elect`: campaign in the election KEY publishing this value, instead of
    /// taking a lock; without `--wait`, wait as long as it takes.
    #[arg(skip)]
    pub(crate) election: Option<String>,
}

/// What `exec` holds while the command runs: one lock (or an election's leadership), or
/// several keys taken together.
#[derive(Debug)]
enum Held {
    One(LockGuard),
    Set(MultiLockGuard),
}

impl Held {
    /// Each key's guard, in the set's order.
    fn guards(&self) -> &[LockGuard] {
        match self {
            Held::One(guard) => std::slice::from_ref(guard),
            Held::Set(set) => set.guards(),
        }
    }

    fn token(&self, key: &str) -> Option<FencingToken> {
        self.guards()
            .iter()
            .find(|g| g.key().as_str() == key)
            .map(|g| g.token())
    }

    /// Until when every key is held: the earliest lease.
    fn valid_until(&self) -> Instant {
        match self {
            Held::One(guard) => guard.valid_until(),
            Held::Set(set) => set.valid_until(),
        }
    }

    /// Fires when any key is lost.
    fn lost(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        match self {
            Held::One(guard) => Box::pin(guard.lost()),
            Held::Set(set) => Box::pin(set.lost()),
        }
    }

    fn is_lost(&self) -> bool {
        self.guards().iter().any(|g| g.is_lost())
    }

    /// The key to name when the hold as a whole ended: the one lost, else the one whose
    /// lease ends first (the one whose renewals failed).
    fn weakest(&self) -> String {
        let guards = self.guards();
        guards
            .iter()
            .find(|g| g.is_lost())
            .or_else(|| guards.iter().min_by_key(|g| g.valid_until()))
            .map(|g| g.key().to_string())
            .unwrap_or_default()
    }

    async fn release(self) -> Result<ReleaseOutcome, LockError> {
        match self {
            Held::One(guard) => guard.release().await,
            Held::Set(set) => set.release().await,
        }
    }
}

/// The keys as one line shows them: `k`, or `a, b`.
fn shown(keys: &[String]) -> String {
    keys.join(", ")
}

/// `the lock on k`, or `the locks on a, b`.
fn locks_on(keys: &[String]) -> String {
    match keys {
        [key] => format!("the lock on {key}"),
        _ => format!("the locks on {}", shown(keys)),
    }
}

/// Refuses, before anything is sent, keys the store would refuse, a key named twice, and
/// options a set of keys cannot have.
fn check_keys(args: &ExecArgs) -> Result<(), Failure> {
    let several = args.keys.len() > 1;
    for (i, key) in args.keys.iter().enumerate() {
        if let Err(e) = LockKey::new(key) {
            let context = if several {
                format!("cannot take the locks: key {} ({key:?})", i + 1)
            } else if args.election.is_some() {
                "cannot lead the election".to_owned()
            } else {
                "cannot take the lock".to_owned()
            };
            return Err(Failure::from_lock_error(&e, &context));
        }
        if args.keys[..i].contains(key) {
            return Err(Failure::new(
                codes::USAGE,
                format!("the key {key:?} is given twice: name each key once"),
            ));
        }
    }
    if several && args.limit.is_some() {
        return Err(Failure::new(
            codes::USAGE,
            format!(
                "--limit takes one key (a semaphore of N), not {}: run a distlock exec per key, \
                 or drop --limit to take the keys together as locks",
                args.keys.len()
            ),
        ));
    }
    Ok(())
}

/// Runs `distlock exec` (or `elect`); `verbose`: say which store is used, and when the
/// lock is taken and released.
pub async fn run(args: ExecArgs, url: &str, quiet: bool, verbose: bool) -> Result<u8, Failure> {
    if args.ttl.is_zero() {
        return Err(Failure::new(codes::USAGE, "--ttl must be above zero"));
    }
    let kill_after = args
        .kill_after
        .unwrap_or_else(|| (args.ttl / 3).min(Duration::from_secs(10)));
    if kill_after.is_zero() || kill_after * 2 >= args.ttl {
        return Err(Failure::new(
            codes::USAGE,
            format!(
                "--kill-after ({kill_after:?}) must be above zero and under half the TTL ({:?})",
                args.ttl
            ),
        ));
    }
    check_keys(&args)?;
    let client = connect(url, args.label.as_deref()).await?;
    if verbose {
        eprintln!("distlock: lock store {}", crate::shown_store(url));
    }
    let taken = match &args.election {
        Some(value) => campaign(&client, &args, value, quiet)
            .await
            .map(|g| Some(Held::One(g))),
        None => acquire(&client, &args, quiet).await,
    };
    let held = match taken {
        Ok(Some(held)) => held,
        not_taken => {
            let said = match &not_taken {
                Ok(_) => Some(format!(
                    "{}; not running the command",
                    refusal(&client, &args, false).await
                )),
                Err(Failure {
                    code: codes::CONFLICT,
                    ..
                }) => Some(format!(
                    "gave up after waiting {} (--wait) for {}: {}; not running the command",
                    humantime::format_duration(args.wait.unwrap_or_default()),
                    shown(&args.keys),
                    refusal(&client, &args, true).await
                )),
                Err(_) => None,
            };
            // A refused request may have left something in the store for itself (a place in
            // a queue, a reservation that keeps a writer's or a larger claim's turn): the
            // client takes it back in the background, and this process must not exit before
            // it has, or the key stays kept for nobody until the TTL runs out. Bounded, as
            // the release after a command is.
            let _ = tokio::time::timeout(RELEASE_LIMIT, client.shutdown()).await;
            return match (said, not_taken) {
                (Some(said), _) => {
                    eprintln!("distlock: {said}");
                    Ok(args.conflict_exit_code)
                }
                (None, Err(f)) => Err(f),
                (None, Ok(_)) => Ok(args.conflict_exit_code),
            };
        }
    };
    if verbose {
        // In the order given, as the command's variables number them.
        let took: Vec<String> = args
            .keys
            .iter()
            .filter_map(|key| Some(format!("{key} (fencing token {})", held.token(key)?.get())))
            .collect();
        eprintln!("distlock: took {}", took.join(", "));
    }
    let code = supervise(&held, &args, kill_after, quiet).await;
    // Bounded: a store that cannot be reached now would keep us here; the TTL frees it.
    let released = match tokio::time::timeout(RELEASE_LIMIT, held.release()).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the store did not answer within {}",
            humantime::format_duration(RELEASE_LIMIT)
        )),
    };
    let _ = tokio::time::timeout(RELEASE_LIMIT, client.shutdown()).await;
    match (code, released) {
        (Ok(code), Ok(_)) => {
            if verbose {
                eprintln!("distlock: released {}", shown(&args.keys));
            }
            Ok(code)
        }
        (Ok(code), Err(why)) => {
            eprintln!(
                "distlock: warning: could not release {} ({why}); it frees itself when its TTL ({}) runs out",
                locks_on(&args.keys),
                humantime::format_duration(args.ttl)
            );
            Ok(code)
        }
        (Err(f), _) => Err(f),
    }
}

/// Why the keys could not be had, to follow "distlock: ": `KEY is HOLDER` for one key;
/// for a set, that for each key held now, and that none was taken (`named`: the line has
/// listed the keys already).
async fn refusal(client: &LockClient, args: &ExecArgs, named: bool) -> String {
    if let [key] = args.keys.as_slice() {
        let line = holder_line(client, key, true, Form::Full).await;
        let subject = if named { "it" } else { key };
        return format!("{subject} is {line}");
    }
    let held = held_lines(client, &args.keys).await;
    let held = if held.is_empty() {
        // Released since the refusal, kept for a waiter that came first, or held by a
        // transaction the store does not list.
        let transaction = unlisted_holds(client).map_or_else(String::new, |store| {
            format!(", or a transaction holds one ({store} does not list those)")
        });
        format!(
            "none of them is held now (one was released just now, or its next turn is kept \
             for a process that waits for it{transaction})"
        )
    } else {
        held.join("; ")
    };
    if named {
        format!("{held}; took none of them")
    } else {
        format!("{held}; took none of {}", shown(&args.keys))
    }
}

/// Takes the lock (or every key, all or nothing): one attempt without `--wait`, else waits
/// with progress on stderr.
async fn acquire(
    client: &LockClient,
    args: &ExecArgs,
    quiet: bool,
) -> Result<Option<Held>, Failure> {
    let failed = |e: LockError| {
        let context = if args.keys.len() > 1 {
            "cannot take the locks"
        } else {
            "cannot take the lock"
        };
        Failure::from_lock_error(&e, context)
    };
    if let [key] = args.keys.as_slice() {
        let request = match args.limit {
            Some(n) => client.semaphore(key, n),
            None if args.shared => client.lock(key).shared(),
            None => client.lock(key),
        }
        .ttl(args.ttl);
        let Some(wait) = args.wait else {
            return request
                .try_acquire()
                .await
                .map(|g| g.map(Held::One))
                .map_err(failed);
        };
        return wait_for(client, args, quiet, request.wait(wait).acquire())
            .await
            .map(|g| Some(Held::One(g)));
    }
    // `--limit` with several keys was refused by `check_keys`.
    let mut request = client.lock_all(&args.keys).ttl(args.ttl);
    if args.shared {
        request = request.shared();
    }
    let Some(wait) = args.wait else {
        return request
            .try_acquire()
            .await
            .map(|s| s.map(Held::Set))
            .map_err(failed);
    };
    wait_for(client, args, quiet, request.wait(wait).acquire())
        .await
        .map(|s| Some(Held::Set(s)))
}

/// Leads the election `args.keys[0]` publishing `value`, waiting (as long as `--wait` says,
/// or for ever) with progress on stderr.
async fn campaign(
    client: &LockClient,
    args: &ExecArgs,
    value: &str,
    quiet: bool,
) -> Result<LockGuard, Failure> {
    let Some(key) = args.keys.first() else {
        return Err(Failure::new(codes::USAGE, "no election named"));
    };
    let mut election = client.election(key).ttl(args.ttl);
    if let Some(wait) = args.wait {
        election = election.wait(wait);
    }
    let value = value.to_owned();
    let leading = async move {
        let leadership = election.campaign(value).await?;
        Ok(leadership.into_guard())
    };
    wait_for(client, args, quiet, leading).await
}

/// The key the progress line names and its holder: the key itself for one; for a set, the
/// first that another process holds.
async fn awaited(client: &LockClient, args: &ExecArgs, form: Form) -> (String, String) {
    match args.keys.as_slice() {
        [key] => (key.clone(), holder_line(client, key, false, form).await),
        keys => {
            // The keys this process took on its way to the rest carry its own label.
            let own = args
                .label
                .clone()
                .unwrap_or_else(distlock::driver::default_label);
            set_holder_line(client, keys, &own, form).await
        }
    }
}

/// Waits for `taking` (an acquisition or a campaign) with progress on stderr; SIGINT and
/// SIGTERM stop the wait.
async fn wait_for<T>(
    client: &LockClient,
    args: &ExecArgs,
    quiet: bool,
    taking: impl Future<Output = Result<T, LockError>>,
) -> Result<T, Failure> {
    let started = Instant::now();
    // Boxed rather than pinned on the stack, so it can be dropped (and its attempt handed
    // to the client's background cleanup) before `shutdown` below waits for that cleanup.
    let mut acquire = Box::pin(taking);
    // Through `signals`, as the command's supervision listens for them after this.
    let mut interrupt =
        signals::listen(libc::SIGINT).map_err(|e| Failure::new(codes::SOFTWARE, e.to_string()))?;
    let mut terminate =
        signals::listen(libc::SIGTERM).map_err(|e| Failure::new(codes::SOFTWARE, e.to_string()))?;
    let tty = std::io::stderr().is_terminal();
    // Drawn at the first progress line, so a lock taken at once leaves no trace.
    let mut spinner: Option<indicatif::ProgressBar> = None;
    let tick = if tty {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    };
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + tick.min(Duration::from_millis(300)),
        tick,
    );
    // A look-up slower than a tick (a store that barely answers) must not make the
    // progress line come in bursts.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The signal that stopped the wait, if one did.
    let mut stopped_by = None;
    let result = loop {
        tokio::select! {
            r = &mut acquire => break r,
            _ = interrupt.recv() => {
                stopped_by = Some(("interrupted (SIGINT)", codes::INTERRUPTED));
                break Err(LockError::Shutdown);
            }
            _ = terminate.recv() => {
                stopped_by = Some(("terminated (SIGTERM)", codes::TERMINATED));
                break Err(LockError::Shutdown);
            }
            _ = ticker.tick(), if !quiet => {
                let waited = Duration::from_secs(started.elapsed().as_secs());
                // The acquisition goes on meanwhile: its answer (or its deadline) ends the
                // wait at once, however long the look-up of the holder takes.
                let form = if tty { Form::Brief } else { Form::Full };
                let (key, holder) = tokio::select! {
                    biased;
                    r = &mut acquire => break r,
                    awaited = awaited(client, args, form) => awaited,
                };
                let to_lead = if args.election.is_some() { " to lead" } else { "" };
                let waited = humantime::format_duration(waited);
                let line = if tty {
                    // One row: what the person waits for first, how long last.
                    let tail = format!(" (waiting {waited}{to_lead})");
                    spinner::row(&key, &holder, &tail, spinner::columns())
                } else {
                    let what = if to_lead.is_empty() { " for" } else { to_lead };
                    format!("waiting{what} {key} ({waited} so far): it is {holder}")
                };
                if tty {
                    spinner.get_or_insert_with(spinner::start).set_message(line);
                } else {
                    eprintln!("distlock: {line}");
                }
            }
        }
    };
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    drop(acquire);
    match (result, stopped_by) {
        (Ok(held), _) => Ok(held),
        (Err(_), Some((how, code))) => {
            // The cancelled request releases whatever it got; shutdown waits for that, but
            // not for long: a stopped distlock must exit, and the TTL frees what is left.
            let _ = tokio::time::timeout(RELEASE_LIMIT, client.shutdown()).await;
            Err(Failure::new(
                code,
                format!(
                    "{how} while waiting for {}; the command was not run",
                    locks_on(&args.keys)
                ),
            ))
        }
        (Err(e), None) if args.election.is_some() => {
            Err(Failure::from_lock_error(&e, "cannot lead the election"))
        }
        (Err(e), None) if args.keys.len() > 1 => {
            Err(Failure::from_lock_error(&e, "cannot take the locks"))
        }
        (Err(e), None) => Err(Failure::from_lock_error(&e, "cannot take the lock")),
    }
}

/// The command's environment: what distlock sets, and what it removes from what it
/// inherited.
struct ChildEnv {
    set: Vec<(String, String)>,
    /// The store's URL, and the variables of an enclosing `distlock exec`, which name
    /// other locks.
    strip: Vec<String>,
}

/// `DISTLOCK_KEY_COUNT` and, for each key in the order given, `DISTLOCK_KEY_<n>` and
/// `DISTLOCK_FENCING_TOKEN_<n>` (n from 1); with one key also `DISTLOCK_KEY` and
/// `DISTLOCK_FENCING_TOKEN`, left out for a set so that a script written for one lock
/// cannot take one key's token for another's; and `DISTLOCK_MODE`. One value a variable:
/// keys with spaces or `=` need no parsing.
fn environment(held: &Held, keys: &[String]) -> Result<ChildEnv, Failure> {
    let mut set = vec![("DISTLOCK_KEY_COUNT".to_owned(), keys.len().to_string())];
    for (n, key) in keys.iter().enumerate() {
        let token = held.token(key).ok_or_else(|| {
            Failure::new(
                codes::SOFTWARE,
                format!("internal error: no fencing token for {key:?}, which was taken"),
            )
        })?;
        if let [_] = keys {
            set.push(("DISTLOCK_KEY".to_owned(), key.clone()));
            set.push(("DISTLOCK_FENCING_TOKEN".to_owned(), token.to_string()));
        }
        set.push((format!("DISTLOCK_KEY_{}", n + 1), key.clone()));
        set.push((
            format!("DISTLOCK_FENCING_TOKEN_{}", n + 1),
            token.to_string(),
        ));
    }
    if let Some(guard) = held.guards().first() {
        set.push(("DISTLOCK_MODE".to_owned(), guard.claim().mode().to_string()));
    }
    let mut strip = vec!["DISTLOCK_URL".to_owned()];
    strip.extend(std::env::vars_os().filter_map(|(name, _)| {
        let name = name.into_string().ok()?;
        names_a_lock(&name).then_some(name)
    }));
    Ok(ChildEnv { set, strip })
}

/// Whether `name` is one of the variables `exec` gives its command about its locks.
fn names_a_lock(name: &str) -> bool {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    matches!(
        name,
        "DISTLOCK_KEY" | "DISTLOCK_FENCING_TOKEN" | "DISTLOCK_KEY_COUNT"
    ) || numbered("DISTLOCK_KEY_")
        || numbered("DISTLOCK_FENCING_TOKEN_")
}

/// Runs the command under `held` and returns the exit code to report.
async fn supervise(
    held: &Held,
    args: &ExecArgs,
    kill_after: Duration,
    quiet: bool,
) -> Result<u8, Failure> {
    let env = environment(held, &args.keys)?;
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return Err(Failure::new(codes::USAGE, "no command given")),
    };
    // Listening before the command exists: a signal sent once it runs (its pid known)
    // must reach it, not end distlock with the default action. Those passed on to the
    // command's group go through `signals`, which tells where each came from.
    let failed = |e: std::io::Error| Failure::new(codes::SOFTWARE, e.to_string());
    let sig = |signal| signals::listen(signal).map_err(failed);
    let (mut int, mut term, mut hup, mut quit) = (
        sig(libc::SIGINT)?,
        sig(libc::SIGTERM)?,
        sig(libc::SIGHUP)?,
        sig(libc::SIGQUIT)?,
    );
    // The command stopping or continuing, and distlock being continued (`fg`, `bg`).
    let (mut chld, mut cont) = (
        signal(SignalKind::child()).map_err(failed)?,
        sig(libc::SIGCONT)?,
    );
    // The command uses the terminal as a foreground job does, if distlock is one.
    let mut terminal = terminal::Terminal::open();
    let for_child = terminal.as_ref().map(terminal::Terminal::for_child);
    let mut child = match child::spawn(program, rest, &env.set, &env.strip, for_child) {
        Ok(child) => child,
        Err(e) => {
            let (code, why) = match e.kind() {
                std::io::ErrorKind::NotFound => (codes::NOT_FOUND, "command not found".into()),
                std::io::ErrorKind::PermissionDenied => (
                    codes::NOT_EXECUTABLE,
                    "permission denied (is it an executable file?)".into(),
                ),
                _ => (codes::SOFTWARE, e.to_string()),
            };
            return Err(Failure::new(code, format!("cannot run {program:?}: {why}")));
        }
    };
    // The child leads its group: its pid is the group's id.
    let group = child.id().map_or(0, |pid| pid as libc::pid_t);
    signals::command_group(group);
    if let (Some(t), Some(c)) = (terminal.as_mut(), for_child) {
        t.given(&c, group);
    }
    let mut lost = held.lost();
    // The early warning: a line at the first failed renewal of a key, and one when they
    // recover.
    let mut health: Vec<_> = held
        .guards()
        .iter()
        .map(|g| (g.key().to_string(), g.renewal_health()))
        .collect();
    // Set once we start stopping the child because the lock is (or is about to be) gone.
    let mut stopping: Option<Instant> = None;
    // Why, for the one line that reports it once the command has ended.
    let mut stopped_because = "was lost";
    // Set when a signal (Ctrl-C, SIGTERM, ...) asked the command to end: the moment it gets
    // SIGKILL if it has not ended by then.
    let mut ending: Option<Instant> = None;
    let mut killed = false;
    let status = loop {
        let valid_until = held.valid_until();
        let term_at = valid_until
            .checked_sub(kill_after)
            .unwrap_or_else(Instant::now);
        // SIGKILL before the lease ends, but give SIGTERM a moment when the loss was sudden.
        let lost_kill_at = stopping.map(|t| {
            valid_until
                .checked_sub(kill_after / 4)
                .unwrap_or_else(Instant::now)
                .max(t + (kill_after / 4).min(Duration::from_secs(1)))
        });
        let kill_at = match (lost_kill_at, ending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A signal to distlock: passed on to the command's group (unless the group had it
        // already), which is continued if stopped, and killed if it has not ended within
        // --kill-after.
        let mut end = None;
        tokio::select! {
            // After a stall (distlock paused, its VM frozen) the child's exit and the lease
            // timers are ready together. A child that had already finished must be judged
            // below, not "stopped": so its exit is looked at first, here and (as its
            // notification may not have been seen yet) again before stopping it.
            biased;
            status = child.wait() => break status,
            _ = int.recv() => end = Some(libc::SIGINT),
            _ = term.recv() => end = Some(libc::SIGTERM),
            _ = hup.recv() => end = Some(libc::SIGHUP),
            _ = quit.recv() => end = Some(libc::SIGQUIT),
            _ = chld.recv() => {
                for pause in child::paused(&child) {
                    if ending.is_some() || stopping.is_some() {
                        break;
                    }
                    watch_pause(pause, terminal.as_mut(), &child, &args.keys, group);
                }
            }
            _ = cont.recv() => {
                // distlock was stopped and continued (`fg` or `bg` in a shell): so is the
                // command, with the terminal if distlock has it now. Not for the SIGCONT
                // distlock sent the group it is in, which came back to it.
                let from = signals::heard(libc::SIGCONT);
                if from.elsewhere && ending.is_none() && stopping.is_none() {
                    if let Some(t) = terminal.as_mut() {
                        t.give(group);
                    }
                    child::signal_group(&child, libc::SIGCONT);
                }
            }
            _ = &mut lost, if stopping.is_none() => {
                if let Ok(Some(status)) = child.try_wait() {
                    break Ok(status);
                }
                child::end_group(&child, libc::SIGTERM);
                stopping = Some(Instant::now());
            }
            _ = tokio::time::sleep_until(term_at.into()), if stopping.is_none() => {
                // Renewals moved valid_until on: nothing to do. Otherwise they are failing.
                if held.valid_until() <= valid_until {
                    if let Ok(Some(status)) = child.try_wait() {
                        break Ok(status);
                    }
                    stopped_because = "could not be renewed before its lease ended";
                    child::end_group(&child, libc::SIGTERM);
                    stopping = Some(Instant::now());
                }
            }
            Some(i) = any_changed(&mut health), if stopping.is_none() => {
                if let Some((key, health)) = health.get_mut(i) {
                    let now = health.borrow_and_update().clone();
                    if !quiet {
                        renewal_line(key, &now, held.valid_until(), kill_after);
                    }
                }
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now).into()), if kill_at.is_some() && !killed => {
                // Out of the command's group first: SIGKILL to the group must not reach
                // distlock, which still has the lock to release. If it cannot leave (it
                // always can: it joined), it kills the command alone.
                let out = match terminal.as_mut() {
                    Some(t) => t.leave(),
                    None => true,
                };
                if out {
                    child::end_group(&child, libc::SIGKILL);
                } else {
                    let _ = child.start_kill();
                }
                killed = true;
            }
        }
        if let Some(signal) = end {
            let from = signals::heard(signal);
            // A key typed at the terminal while distlock is in the command's group reached
            // the command too: passing it on would make it twice, and many programs take a
            // second Ctrl-C as "quit now". distlock's own signal to that group, come back to
            // it, is nothing new.
            if from.elsewhere {
                child::end_group(&child, signal);
            }
            if from.elsewhere || from.terminal {
                ending.get_or_insert_with(|| Instant::now() + kill_after);
            }
        }
    };
    // The terminal goes back to distlock's group before anything else is printed.
    drop(terminal);
    let status = status
        .map_err(|e| Failure::new(codes::SOFTWARE, format!("waiting for the command: {e}")))?;
    if stopping.is_some() {
        return Err(Failure::new(
            codes::LOST,
            format!(
                "the lock on {} {stopped_because} while the command ran; the command was stopped (it {})",
                held.weakest(),
                child::describe(status)
            ),
        ));
    }
    // The command exited at some moment before now. If the lease was still valid now, it
    // was valid then; if not (distlock was stalled, or the lock was lost as the command
    // finished), nobody can say whether the command finished while the lock was held.
    if held.is_lost() || Instant::now() >= held.valid_until() {
        return Err(Failure::new(
            codes::LOST,
            format!(
                "the command {}, but the lock on {} could not be confirmed valid when it \
                 finished: the lease ran out or was lost while distlock could not watch it \
                 (e.g. distlock was paused); exiting {} instead of the command's code",
                child::describe(status),
                held.weakest(),
                codes::LOST
            ),
        ));
    }
    Ok(child::exit_code(status))
}

/// What distlock does when the command stops or continues. The terminal goes back to
/// distlock when the command stops (so that Ctrl-C reaches distlock) and to the command when
/// it continues. A command that stopped for the terminal while distlock has it (it was
/// continued, and read before distlock could hand it the terminal) gets it and goes on.
fn watch_pause(
    pause: child::Pause,
    terminal: Option<&mut terminal::Terminal>,
    child: &tokio::process::Child,
    keys: &[String],
    group: libc::pid_t,
) {
    let Some(t) = terminal else {
        if let child::Pause::Stopped(signal) = pause {
            stopped_line(keys, signal, group, false);
        }
        return;
    };
    match pause {
        child::Pause::Stopped(signal) => {
            t.take_back();
            if matches!(signal, libc::SIGTTIN | libc::SIGTTOU) && t.is_foreground() {
                t.give(group);
                if t.is_given() {
                    child::signal_group(child, libc::SIGCONT);
                    return;
                }
            }
            stopped_line(keys, signal, group, t.is_foreground());
        }
        child::Pause::Continued => t.give(group),
    }
}

/// The line for a command that stopped: by which signal, and what ends or resumes it.
/// `at_terminal`: distlock is the terminal's foreground group, so Ctrl-C reaches it.
fn stopped_line(keys: &[String], signal: libc::c_int, group: libc::pid_t, at_terminal: bool) {
    let name = child::signal_name(signal).unwrap_or("a signal");
    let why = match signal {
        libc::SIGTTIN => " (it read the terminal from the background)",
        libc::SIGTTOU => " (it used the terminal from the background)",
        _ => "",
    };
    let end = if at_terminal {
        "Ctrl-C ends it".to_owned()
    } else {
        format!("`kill {}` (distlock) ends it", session::shown_pid())
    };
    let stay = if keys.len() == 1 { "stays" } else { "stay" };
    eprintln!(
        "distlock: the command is stopped by {name}{why} and waiting; {} {stay} held. \
         {end}; `kill -CONT -{group}` resumes it",
        locks_on(keys)
    );
}

/// Resolves with the index of the first receiver in `health` that sees a change; `None`
/// once every sender is gone (never while the guards live).
async fn any_changed(health: &mut [(String, watch::Receiver<RenewalHealth>)]) -> Option<usize> {
    let mut changes: Vec<_> = health
        .iter_mut()
        .map(|(_, h)| Some(Box::pin(h.changed())))
        .collect();
    std::future::poll_fn(|cx| {
        let mut open = false;
        for (i, slot) in changes.iter_mut().enumerate() {
            let Some(change) = slot else { continue };
            match change.as_mut().poll(cx) {
                Poll::Ready(Ok(())) => return Poll::Ready(Some(i)),
                // Its sender is gone: it never changes again, and must not be polled again.
                Poll::Ready(Err(_)) => *slot = None,
                Poll::Pending => open = true,
            }
        }
        if open {
            Poll::Pending
        } else {
            Poll::Ready(None)
        }
    })
    .await
}

/// What a person is told when renewals start failing (the lock is still valid, the command
/// still runs) or recover.
fn renewal_line(key: &str, health: &RenewalHealth, valid_until: Instant, kill_after: Duration) {
    match health {
        RenewalHealth::Failing {
            failures: 1,
            last_error,
            ..
        } => {
            let left = valid_until.saturating_duration_since(Instant::now());
            eprintln!(
                "distlock: warning: cannot renew the lock on {key} ({last_error}); retrying. \
                 The lock stays valid for {:.1}s; the command is stopped {:.1}s before that \
                 unless a renewal gets through",
                left.as_secs_f64(),
                kill_after.as_secs_f64()
            );
        }
        RenewalHealth::Failing { .. } => {}
        _ => eprintln!("distlock: renewing the lock on {key} works again"),
    }
}
