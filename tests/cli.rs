//! The `distlock` command, run as separate processes against real stores: SQLite by
//! default, and the Redis / PostgreSQL servers of `scripts/servers.sh` when compiled in.
#![cfg(all(feature = "cli", feature = "sqlite"))]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

struct Env {
    dir: PathBuf,
    url: String,
}

impl Env {
    fn new(name: &str) -> Env {
        let dir = std::env::temp_dir().join(format!("distlock-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite:{}", dir.join("locks.sqlite3").display());
        Env { dir, url }
    }

    #[allow(dead_code)] // used by the tests of optional backends
    fn with_url(name: &str, url: String) -> Env {
        let mut env = Env::new(name);
        env.url = url;
        env
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("DISTLOCK_URL", &self.url).env_remove("DISTLOCK_LOG");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        let child = self
            .cmd()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_output(child, Duration::from_secs(60))
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.cmd()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_output(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "distlock did not finish within {limit:?}: {:?}",
                child.wait_with_output().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// A running distlock whose stderr is read line by line as it comes.
struct Watched {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Watched {
    fn new(mut child: Child) -> Watched {
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watched {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle`.
    fn wait_for_line(&mut self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no line with {needle:?} within {limit:?}: {:?}", self.seen);
                }
            }
        }
    }

    /// Waits for exit; returns the exit status and all of stderr.
    fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!("distlock did not finish within {limit:?}: {:?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The reader ends at EOF, which follows the exit.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status, self.seen.join("\n"))
    }
}

fn kill(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// The state letter of /proc/PID/stat (R, S, T for stopped, Z for zombie...).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim_start().chars().next()
}

fn alive(pid: i32) -> bool {
    // A zombie (reaped late by PID 1 here) counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn held(env: &Env, key: &str) -> bool {
    let o = env.run(&["status", "--json", key]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("status failed ({e}): {}", stderr(&o)));
    let held = v["held"].as_bool().unwrap();
    // 0 for a free key, 75 for a held one (docs/cli.md).
    assert_eq!(o.status.code(), Some(if held { 75 } else { 0 }), "{v}");
    held
}

/// How many hold `key` (the holders in `status --json`; 0 when that cannot be read).
fn holder_count(env: &Env, key: &str) -> usize {
    let o = env.run(&["status", "--json", key]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["holders"].as_array().map_or(0, Vec::len)
}

/// A shell command that runs until the file `stop` exists.
fn hold_until(stop: &Path) -> String {
    format!("while [ ! -e {} ]; do sleep 0.05; done", stop.display())
}

/// Two `exec --shared key` commands that hold `key` until `stop` exists, once both hold it.
fn two_readers(env: &Env, key: &str, stop: &Path) -> Vec<Child> {
    let hold = hold_until(stop);
    let readers = (0..2)
        .map(|_| env.spawn(&["exec", "--shared", key, "--", "sh", "-c", &hold]))
        .collect();
    wait_for("two readers", Duration::from_secs(30), || {
        holder_count(env, key) == 2
    });
    readers
}

/// Concurrent processes increment a counter file under the lock without losing an update,
/// and the fencing tokens they are handed strictly increase in the order they ran.
fn counter_and_tokens(env: &Env) {
    let counter = env.path("counter");
    let tokens = env.path("tokens");
    std::fs::write(&counter, "0").unwrap();
    let script = format!(
        "v=$(cat {c}); sleep 0.02; echo $((v+1)) > {c}; echo $DISTLOCK_FENCING_TOKEN >> {t}",
        c = counter.display(),
        t = tokens.display()
    );
    let procs: Vec<_> = (0..8)
        .map(|_| {
            env.spawn(&[
                "exec", "--wait", "60s", "counter", "--", "sh", "-c", &script,
            ])
        })
        .collect();
    for p in procs {
        let o = wait_output(p, Duration::from_secs(90));
        assert!(o.status.success(), "exec failed: {}", stderr(&o));
    }
    assert_eq!(
        std::fs::read_to_string(&counter).unwrap().trim(),
        "8",
        "lost updates"
    );
    let seen: Vec<u64> = std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 8);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {seen:?}"
    );
    assert!(!held(env, "counter"));
}

#[test]
fn sqlite_counter_and_tokens() {
    counter_and_tokens(&Env::new("counter"));
}

#[cfg(feature = "redis")]
#[test]
fn redis_counter_and_tokens() {
    let url = std::env::var("DISTLOCK_TEST_REDIS_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_REDIS_URL)");
    counter_and_tokens(&Env::with_url("redis-counter", url));
}

#[cfg(feature = "redis")]
#[test]
fn redis_cluster_counter_and_tokens() {
    let url = std::env::var("DISTLOCK_TEST_REDIS_CLUSTER_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_REDIS_CLUSTER_URL)");
    counter_and_tokens(&Env::with_url("redis-cluster-counter", url));
}

#[cfg(feature = "redis")]
#[test]
fn redis_sentinel_counter_and_tokens() {
    let url = std::env::var("DISTLOCK_TEST_REDIS_SENTINEL_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_REDIS_SENTINEL_URL)");
    counter_and_tokens(&Env::with_url("redis-sentinel-counter", url));
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_counter_and_tokens() {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_POSTGRES_URL)");
    counter_and_tokens(&Env::with_url("postgres-counter", url));
}

/// The child's exit code is passed on; its environment has the key and token, not the URL.
#[test]
fn exit_code_and_environment() {
    let env = Env::new("environment");
    let o = env.run(&[
        "exec",
        "k",
        "--",
        "sh",
        "-c",
        "echo \"$DISTLOCK_KEY|$DISTLOCK_FENCING_TOKEN|${DISTLOCK_URL:-none}\"; exit 7",
    ]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    let out = stdout(&o);
    let parts: Vec<_> = out.trim().split('|').collect();
    assert_eq!(parts[0], "k");
    assert!(parts[1].parse::<u64>().unwrap() > 0);
    assert_eq!(parts[2], "none", "the child saw the store URL");
    assert!(!held(&env, "k"), "the lock was left held");
}

/// A held lock without --wait: the command does not run; exit 75 (or the chosen code)
/// with one line naming the holder and its remaining TTL. With --wait it runs afterwards.
#[test]
fn conflict_and_wait() {
    let env = Env::new("conflict");
    let flag = env.path("started");
    let holder = env.spawn(&[
        "exec",
        "--label",
        "night-report",
        "job",
        "--",
        "sh",
        "-c",
        &format!("touch {}; sleep 2", flag.display()),
    ]);
    wait_for(
        "the holder's command to start",
        Duration::from_secs(10),
        || flag.exists(),
    );
    let o = env.run(&[
        "exec",
        "job",
        "--",
        "touch",
        env.path("ran").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("night-report") && err.contains("free in at most"),
        "{err}"
    );
    assert!(
        !env.path("ran").exists(),
        "the command ran although the lock was held"
    );
    let o = env.run(&["exec", "--conflict-exit-code", "9", "job", "--", "true"]);
    assert_eq!(o.status.code(), Some(9));
    let o = env.run(&[
        "exec",
        "--wait",
        "30s",
        "job",
        "--",
        "touch",
        env.path("ran").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(env.path("ran").exists());
    let _ = wait_output(holder, Duration::from_secs(30));
    let o = env.run(&["exec", "--wait", "200ms", "job", "--", "true"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Bad input exits non-zero with one clear line: never a panic or a backtrace, never a
/// password.
#[test]
fn bad_input() {
    let env = Env::new("bad-input");
    let long = "k".repeat(256);
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["exec", "", "--", "true"], 64, "key"),
        (vec!["exec", &long, "--", "true"], 64, "key"),
        (vec!["exec", "--ttl", "0s", "k", "--", "true"], 64, "ttl"),
        (
            vec!["exec", "--ttl", "soon", "k", "--", "true"],
            64,
            "'soon' for '--ttl <TTL>': not a duration",
        ),
        (vec!["exec", "k"], 64, "COMMAND"),
        (
            vec!["exec", "k", "--", "/nonexistent/command"],
            127,
            "cannot run \"/nonexistent/command\": command not found",
        ),
        (
            vec!["--url", "nope://x", "exec", "k", "--", "true"],
            78,
            "known schemes",
        ),
        (
            vec!["--url", "etcdx://h", "status", "k"],
            78,
            "known schemes",
        ),
        (vec!["--url", "no-scheme", "status", "k"], 78, "URL"),
        (vec!["release", "k"], 64, "--force"),
        (
            vec!["--url", "memory:", "exec", "k", "--", "true"],
            78,
            "each process would get a store of its own",
        ),
        (vec!["--url", "MEMORY:name", "status", "k"], 78, "memory:"),
    ];
    for (args, code, needle) in cases {
        let o = env.run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.to_lowercase().contains(&needle.to_lowercase()),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
        // distlock's own errors are one line (clap's usage errors have their own layout).
        if err.starts_with("distlock:") {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
    }
    #[cfg(not(feature = "etcd"))]
    {
        let o = env.run(&["--url", "etcd://127.0.0.1:1", "status", "k"]);
        assert_eq!(o.status.code(), Some(78));
        assert!(stderr(&o).contains("`etcd` feature"), "{}", stderr(&o));
    }
    #[cfg(feature = "redis")]
    {
        let o = env.run(&[
            "--url",
            "redis://user:hunter22@127.0.0.1:1/",
            "exec",
            "k",
            "--",
            "true",
        ]);
        assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
        assert!(
            !stderr(&o).contains("hunter22"),
            "the password was shown: {}",
            stderr(&o)
        );
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
}

/// Killing distlock with SIGKILL takes its child with it; the lock frees after its TTL.
#[test]
fn sigkill_takes_the_child_along() {
    let env = Env::new("sigkill");
    let pidfile = env.path("child.pid");
    let mut holder = env.spawn(&[
        "exec",
        "--ttl",
        "2s",
        "k",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 60", pidfile.display()),
    ]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    let child = read_pid(&pidfile).unwrap();
    assert!(alive(child));
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_for(
        "the child to die with distlock",
        Duration::from_secs(5),
        || !alive(child),
    );
    assert!(held(&env, "k"), "the lock vanished before its TTL");
    let took = wait_for("the lock to expire", Duration::from_secs(10), || {
        !held(&env, "k")
    });
    assert!(
        took <= Duration::from_secs(3),
        "the lock outlived its TTL: {took:?}"
    );
}

/// The store's file deleted under a running command: its next renewal notices (the
/// connections would go on using the old file, which a second holder would not see), the
/// command is stopped, and distlock exits 79 well before the lease would have run out.
#[test]
fn deleted_store_file_stops_the_command() {
    let env = Env::new("deleted-file");
    let pidfile = env.path("child.pid");
    let script = format!(
        "echo $$ > {p}; while :; do sleep 0.05; done",
        p = pidfile.display()
    );
    let holder = env.spawn(&["exec", "--ttl", "6s", "k", "--", "sh", "-c", &script]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(env.path(&format!("locks.sqlite3{suffix}")));
    }
    let deleted = Instant::now();
    let o = wait_output(holder, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(79), "{}", stderr(&o));
    // The next renewal is at most a third of the TTL away; the lease had 6 s.
    assert!(
        deleted.elapsed() < Duration::from_secs(4),
        "stopping took {:?}",
        deleted.elapsed()
    );
    assert!(stderr(&o).contains("lost"), "{}", stderr(&o));
}

/// A lock broken under a command that ignores SIGTERM: the command is killed before the
/// lease distlock last renewed would have ended, not left running without the lock.
#[test]
fn a_command_ignoring_sigterm_is_killed_before_the_lease_ends() {
    let env = Env::new("lost-stubborn");
    let pidfile = env.path("child.pid");
    let script = format!(
        "trap '' TERM INT HUP; echo $$ > {p}; while :; do sleep 0.05; done",
        p = pidfile.display()
    );
    let ttl = Duration::from_secs(3);
    let holder = env.spawn(&["exec", "--ttl", "3s", "k", "--", "sh", "-c", &script]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    let child = read_pid(&pidfile).unwrap_or_default();
    let o = env.run(&["release", "--force", "k"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let broken = Instant::now();
    let o = wait_output(holder, Duration::from_secs(20));
    let took = broken.elapsed();
    assert_eq!(o.status.code(), Some(79), "{}", stderr(&o));
    // The last renewal was at most a third of the TTL before the break.
    assert!(took < ttl, "the command outlived the lease: {took:?}");
    assert!(!alive(child), "the command still runs");
    assert!(
        stderr(&o).contains("the command was stopped (it was killed by signal 9 (SIGKILL))"),
        "{}",
        stderr(&o)
    );
}

/// A lock broken under a running command: renewal finds it gone, the command is stopped
/// (SIGTERM to its group), and distlock exits 79.
#[test]
fn lost_lock_stops_the_command() {
    let env = Env::new("lost");
    let pidfile = env.path("child.pid");
    let termfile = env.path("got-term");
    let script = format!(
        "trap 'echo term > {t}; exit 0' TERM; echo $$ > {p}; while :; do sleep 0.05; done",
        t = termfile.display(),
        p = pidfile.display()
    );
    let holder = env.spawn(&["exec", "--ttl", "3s", "k", "--", "sh", "-c", &script]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    let o = env.run(&["release", "--force", "k"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning"), "{}", stderr(&o));
    let broken = Instant::now();
    let o = wait_output(holder, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(79), "{}", stderr(&o));
    assert!(
        broken.elapsed() < Duration::from_secs(3),
        "stopping took {:?}",
        broken.elapsed()
    );
    assert!(termfile.exists(), "the command was not sent SIGTERM");
    // One line says it all, once the command has ended.
    let said = stderr(&o);
    assert_eq!(
        said.lines().filter(|l| l.contains("lost")).count(),
        1,
        "{said}"
    );
    assert!(
        said.contains("the lock on k was lost while the command ran; the command was stopped"),
        "{said}"
    );
}

/// Renewals that keep failing (the SQLite file locked by another writer) stop the command
/// with SIGTERM before the lease ends, and distlock exits 79.
#[test]
fn failing_renewals_stop_the_command_before_the_lease_ends() {
    let env = Env::new("renewals");
    let db = env.url.trim_start_matches("sqlite:").to_owned();
    let pidfile = env.path("child.pid");
    let termfile = env.path("term-at");
    let script = format!(
        "trap 'date +%s%N > {t}; exit 0' TERM; echo $$ > {p}; while :; do sleep 0.05; done",
        t = termfile.display(),
        p = pidfile.display()
    );
    let holder = env.spawn(&[
        "exec",
        "--ttl",
        "3s",
        "--kill-after",
        "1s",
        "k",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    // Another writer holds the database's write lock: every renewal fails while it lasts.
    let mut blocker = Command::new("python3")
        .args(["-c", &format!("import sqlite3,time\nc=sqlite3.connect({db:?},isolation_level=None)\nc.execute('BEGIN EXCLUSIVE')\nprint('locked',flush=True)\ntime.sleep(8)")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The block starts when python has the write lock, not when it was spawned: under load
    // its start-up alone can take most of a second.
    let mut locked = String::new();
    std::io::BufReader::new(blocker.stdout.take().unwrap())
        .read_line(&mut locked)
        .unwrap();
    assert_eq!(
        locked.trim(),
        "locked",
        "the blocker did not lock the database"
    );
    let blocked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let o = wait_output(holder, Duration::from_secs(30));
    let _ = blocker.kill();
    let _ = blocker.wait();
    assert_eq!(o.status.code(), Some(79), "{}", stderr(&o));
    let term_ns: u128 = std::fs::read_to_string(&termfile)
        .expect("the command was not sent SIGTERM")
        .trim()
        .parse()
        .unwrap();
    let term_after = Duration::from_nanos((term_ns - blocked.as_nanos()) as u64);
    // The last renewal happened before the block, so the lease ends at most 3 s after it:
    // SIGTERM must come before that (it is due 1 s before the end).
    assert!(
        term_after < Duration::from_millis(2900),
        "SIGTERM came {term_after:?} after renewals stopped"
    );
    // The first failed renewal is announced while the lock is still valid; one line says
    // why the command was stopped, once it has ended.
    let err = stderr(&o);
    let warned = err.find("warning: cannot renew the lock on");
    let stopped = err.find(
        "could not be renewed before its lease ended while the command ran; the command was stopped",
    );
    assert!(
        matches!((warned, stopped), (Some(w), Some(s)) if w < s),
        "{err}"
    );
}

/// SIGTERM to distlock is forwarded to the command; the lock is released after it exits.
#[test]
fn signals_are_forwarded() {
    let env = Env::new("signals");
    let pidfile = env.path("child.pid");
    let termfile = env.path("got-term");
    let script = format!(
        "trap 'echo term > {t}; exit 5' TERM; echo $$ > {p}; while :; do sleep 0.05; done",
        t = termfile.display(),
        p = pidfile.display()
    );
    let holder = env.spawn(&["exec", "k", "--", "sh", "-c", &script]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    let status = Command::new("kill")
        .args(["-TERM", &holder.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let o = wait_output(holder, Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(termfile.exists());
    assert!(!held(&env, "k"), "the lock was left held");
}

/// A signal while waiting for the lock stops the wait with the shell's code for it:
/// SIGINT 130, SIGTERM 143 (128 + the signal), one line saying which; the command does
/// not run and the holder keeps the lock.
#[test]
fn signals_while_waiting_for_the_lock() {
    let env = Env::new("signal-wait");
    let started = env.path("started");
    let mut holder = env.spawn(&[
        "exec",
        "job",
        "--",
        "sh",
        "-c",
        &format!("touch {}; exec sleep 120", started.display()),
    ]);
    wait_for("the holder to start", Duration::from_secs(10), || {
        started.exists()
    });
    for (signal, code, says) in [("TERM", 143, "(SIGTERM)"), ("INT", 130, "(SIGINT)")] {
        let ran = env.path("ran");
        let mut waiter = Watched::new(env.spawn(&[
            "exec",
            "--wait",
            "100s",
            "job",
            "--",
            "touch",
            ran.to_str().unwrap(),
        ]));
        waiter.wait_for_line("waiting for job", Duration::from_secs(20));
        kill(waiter.child.id(), signal);
        let (status, err) = waiter.finish(Duration::from_secs(20));
        assert_eq!(status.code(), Some(code), "SIG{signal}: {err}");
        let last = err.lines().last().unwrap_or("");
        assert!(
            last.contains(says) && last.contains("the command was not run"),
            "SIG{signal}: {err}"
        );
        assert!(!ran.exists(), "the command ran after SIG{signal}");
        assert!(held(&env, "job"), "the holder lost the lock");
    }
    let _ = holder.kill();
    let _ = holder.wait();
}

/// distlock paused past the lease while its command finishes: when it resumes it cannot
/// tell whether the command finished under the lock. It exits 79 with one line that gives
/// the command's own exit status and says the lock could not be confirmed valid.
#[test]
fn command_finished_while_distlock_was_stalled_past_the_lease() {
    let env = Env::new("stalled");
    let pidfile = env.path("child.pid");
    let script = format!(
        "trap 'exit 3' USR1; echo $$ > {p}; while :; do sleep 0.05; done",
        p = pidfile.display()
    );
    let holder = env.spawn(&["exec", "--ttl", "1s", "k", "--", "sh", "-c", &script]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    let child = read_pid(&pidfile).unwrap();
    let distlock = holder.id() as i32;
    kill(holder.id(), "STOP");
    wait_for("distlock to stop", Duration::from_secs(10), || {
        proc_state(distlock) == Some('T')
    });
    kill(child as u32, "USR1");
    wait_for("the command to exit", Duration::from_secs(10), || {
        !alive(child)
    });
    wait_for("the lease to run out", Duration::from_secs(20), || {
        !held(&env, "k")
    });
    kill(holder.id(), "CONT");
    let o = wait_output(holder, Duration::from_secs(20));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(79), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("exited with code 3") && err.contains("could not be confirmed"),
        "{err}"
    );
}

/// The usage printed when the command is missing names what is missing and shows the
/// real syntax; `--url` has a default and must not look required, even when it comes
/// from DISTLOCK_URL (which these tests set).
#[test]
fn missing_command_usage() {
    let env = Env::new("usage");
    let o = env.run(&["exec", "k"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("<COMMAND>"), "{err}");
    assert!(
        err.contains("Usage: distlock exec [OPTIONS] <KEY>... -- <COMMAND> [ARGS]..."),
        "{err}"
    );
    assert!(!err.contains("--url <URL>"), "{err}");
    // The command without `--`: clap sees an unexpected argument (`elect`) or more keys
    // and no command (`exec`); the tip says where the command goes.
    for (sub, keys) in [("exec", "KEY..."), ("elect", "KEY")] {
        let o = env.run(&[sub, "k", "true"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(64), "{err}");
        assert!(
            err.contains(&format!(
                "the command goes after `--`: distlock {sub} [OPTIONS] {keys} -- COMMAND"
            )),
            "{err}"
        );
    }
    let o = env.run(&["status"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(
        err.contains("<KEY>") && !err.contains("--url <URL>"),
        "{err}"
    );
}

/// `exec --help` (and `-h`) list the exit codes.
#[test]
fn exec_help_lists_the_exit_codes() {
    let env = Env::new("help");
    for flag in ["--help", "-h"] {
        let o = env.run(&["exec", flag]);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        assert!(out.contains("Exit codes:"), "{out}");
        for code in [
            "64", "69", "70", "75", "77", "78", "79", "126/127", "130/143",
        ] {
            assert!(
                out.lines().any(|l| l.trim_start().starts_with(code)),
                "exit code {code} missing: {out}"
            );
        }
    }
}

/// Processes that each note how many commands run at once (under `flock`, so the count
/// itself is exact): the most ever seen.
fn most_at_once(env: &Env, args: &[&str], n: usize) -> usize {
    let (cur, seen) = (env.path("current"), env.path("seen"));
    std::fs::write(&cur, "0").unwrap();
    std::fs::write(&seen, "").unwrap();
    let lock = env.path("count.lock");
    let step = |by: &str| {
        format!(
            "flock {l} sh -c 'n=$(( $(cat {c}) {by} )); echo $n > {c}; echo $n >> {s}'",
            l = lock.display(),
            c = cur.display(),
            s = seen.display()
        )
    };
    let script = format!("{}; sleep 0.3; {}", step("+ 1"), step("- 1"));
    let procs: Vec<_> = (0..n)
        .map(|_| {
            let mut all = args.to_vec();
            all.extend(["--", "sh", "-c", &script]);
            env.spawn(&all)
        })
        .collect();
    for p in procs {
        let o = wait_output(p, Duration::from_secs(90));
        assert!(o.status.success(), "exec failed: {}", stderr(&o));
    }
    let seen: Vec<usize> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 2 * n, "not every command ran");
    seen.into_iter().max().unwrap_or(0)
}

/// `exec --limit 3`: eight processes never run more than three commands at once, and do
/// run three at once (the limit is a limit, not a mutex).
#[test]
fn limit_runs_at_most_n_commands_at_once() {
    let env = Env::new("limit");
    let most = most_at_once(&env, &["exec", "--limit", "3", "--wait", "60s", "pool"], 8);
    assert_eq!(most, 3, "at most 3 at once expected, and 3 reached");
    assert!(!held(&env, "pool"));
}

/// `exec --shared`: readers run side by side; `status` lists them; an exclusive `exec` on
/// the key waits for them and runs alone; a semaphore of another size on it is refused.
#[test]
fn shared_commands_overlap_while_an_exclusive_one_waits() {
    let env = Env::new("shared");
    let most = most_at_once(&env, &["exec", "--shared", "--wait", "60s", "doc"], 4);
    assert!(
        most >= 2,
        "shared commands never overlapped (most at once: {most})"
    );
    // Two readers hold; the writer waits for both, then runs alone.
    let stop = env.path("stop");
    let readers = two_readers(&env, "doc", &stop);
    let o = env.run(&["status", "doc"]);
    let text = stdout(&o);
    assert!(text.starts_with("doc: shared by 2 readers:"), "{text}");
    assert!(text.contains("fencing token"), "{text}");
    let o = env.run(&["exec", "doc", "--", "true"]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("shared by 2 readers"), "{}", stderr(&o));
    let o = env.run(&["exec", "--limit", "2", "doc", "--", "true"]);
    assert_eq!(o.status.code(), Some(78), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("exclusive or read-write"),
        "{}",
        stderr(&o)
    );
    let marker = env.path("writer");
    let writer = env.spawn(&[
        "exec",
        "--wait",
        "60s",
        "doc",
        "--",
        "sh",
        "-c",
        &format!(
            "test ! -e {s} && exit 3; touch {m}",
            s = stop.display(),
            m = marker.display()
        ),
    ]);
    std::fs::write(&stop, "").unwrap();
    for r in readers {
        let o = wait_output(r, Duration::from_secs(60));
        assert!(o.status.success(), "reader: {}", stderr(&o));
    }
    let o = wait_output(writer, Duration::from_secs(60));
    assert!(o.status.success(), "writer: {}", stderr(&o));
    assert!(marker.exists());
    assert!(!held(&env, "doc"));
}

/// Refused commands (no `--wait`) leave nothing behind: three `exec --limit 1` refused at
/// once while a command holds the permit, and three exclusive `exec` refused at once while
/// two readers hold the key, each keep their turn in the store when refused (a
/// reservation). Each process takes it back before it exits, so once the holders are done
/// the next commands run at once, not after the refused ones' 30 s TTL.
#[test]
fn refused_commands_leave_the_key_to_the_next() {
    let env = Env::new("refused");
    let stop = env.path("stop");
    let hold = hold_until(&stop);
    let holders: Vec<_> = [
        &["exec", "--limit", "1", "pool", "--", "sh", "-c", &hold][..],
        &["exec", "--shared", "doc", "--", "sh", "-c", &hold],
        &["exec", "--shared", "doc", "--", "sh", "-c", &hold],
    ]
    .iter()
    .map(|args| env.spawn(args))
    .collect();
    wait_for("the holders", Duration::from_secs(30), || {
        held(&env, "pool") && { holder_count(&env, "doc") == 2 }
    });
    let refused: Vec<_> = (0..3)
        .flat_map(|_| {
            [
                env.spawn(&["exec", "--limit", "1", "pool", "--", "true"]),
                env.spawn(&["exec", "doc", "--", "true"]),
            ]
        })
        .collect();
    for r in refused {
        let o = wait_output(r, Duration::from_secs(60));
        assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    }
    std::fs::write(&stop, "").unwrap();
    for h in holders {
        let o = wait_output(h, Duration::from_secs(60));
        assert!(o.status.success(), "holder: {}", stderr(&o));
    }
    for args in [
        &["exec", "--limit", "1", "pool", "--", "true"][..],
        &["exec", "--shared", "doc", "--", "true"],
        &["exec", "doc", "--", "true"],
    ] {
        let o = env.run(args);
        assert!(
            o.status.success(),
            "{args:?} after the holders were done: {}",
            stderr(&o)
        );
    }
}

/// A command refused while nobody holds the key (its next turn kept for a waiter that came
/// first) says so, rather than calling the key free: a writer waits behind two readers and
/// is stopped (SIGSTOP) before it can take its turn once they are done.
#[test]
fn a_refusal_on_a_key_kept_for_a_waiter_says_so() {
    let env = Env::new("kept");
    let stop = env.path("stop");
    let readers = two_readers(&env, "doc", &stop);
    let writer = env.spawn(&["exec", "--quiet", "--wait", "60s", "doc", "--", "true"]);
    // Readers share the key, so a third is turned away only once the writer's turn is kept.
    wait_for("the writer's turn kept", Duration::from_secs(30), || {
        env.run(&["exec", "--shared", "doc", "--", "true"])
            .status
            .code()
            == Some(75)
    });
    // Stopped between two of its writes: another process's write must go through at once
    // (one stopped inside a SQLite write would hold the file's lock for everybody).
    for attempt in 1.. {
        kill(writer.id(), "STOP");
        let mut probe = env.spawn(&["exec", "probe", "--", "true"]);
        let started = Instant::now();
        while probe.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if probe.try_wait().unwrap().is_some() {
            break;
        }
        kill(writer.id(), "CONT");
        wait_output(probe, Duration::from_secs(60));
        assert!(attempt < 5, "the writer was stopped inside a write 5 times");
    }
    std::fs::write(&stop, "").unwrap();
    for r in readers {
        let o = wait_output(r, Duration::from_secs(60));
        assert!(o.status.success(), "reader: {}", stderr(&o));
    }
    let o = env.run(&["exec", "--shared", "doc", "--", "true"]);
    kill(writer.id(), "CONT");
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("doc is free as far as sqlite lists, but a transaction may hold it")
            && stderr(&o).contains("or its next turn is kept for a process that waits for it"),
        "{}",
        stderr(&o)
    );
    let o = wait_output(writer, Duration::from_secs(60));
    assert!(o.status.success(), "writer: {}", stderr(&o));
}

/// `elect`: four campaigners never run their commands at once, and each runs in turn.
#[test]
fn elect_runs_one_leader_at_a_time() {
    let env = Env::new("elect");
    let most = most_at_once(&env, &["elect", "--wait", "60s", "scheduler"], 4);
    assert_eq!(most, 1, "two leaders ran at once");
    let o = env.run(&["leader", "scheduler"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "scheduler: no leader");
}

/// A leader killed with SIGKILL (its command dies with it) is succeeded within its TTL;
/// `leader` shows each one's value and the term its command was given.
#[test]
fn a_killed_leader_is_succeeded_within_its_ttl() {
    let env = Env::new("succession");
    let ttl = Duration::from_secs(2);
    let run_as = |name: &str| {
        let (pid, term) = (
            env.path(&format!("{name}.pid")),
            env.path(&format!("{name}.term")),
        );
        let script = format!(
            "echo $DISTLOCK_FENCING_TOKEN > {t}; echo $$ > {p}; while true; do sleep 0.05; done",
            t = term.display(),
            p = pid.display()
        );
        env.spawn(&[
            "elect", "--ttl", "2s", "--value", name, "svc", "--", "sh", "-c", &script,
        ])
    };
    let mut first = run_as("first");
    wait_for(
        "the first leader's command",
        Duration::from_secs(30),
        || read_pid(&env.path("first.pid")).is_some(),
    );
    let second = run_as("second");
    let o = env.run(&["leader", "--json", "svc"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let first_term: u64 = std::fs::read_to_string(env.path("first.term"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(v["leader"]["value"], "first", "{v}");
    assert_eq!(v["leader"]["term"], first_term, "{v}");
    // Let the second campaigner wait on the first, then kill the first outright.
    std::thread::sleep(Duration::from_millis(300));
    assert!(read_pid(&env.path("second.pid")).is_none(), "two leaders");
    first.kill().unwrap();
    let _ = first.wait();
    let took = wait_for("the successor's command", ttl * 3, || {
        read_pid(&env.path("second.pid")).is_some()
    });
    assert!(
        took <= ttl + Duration::from_secs(2),
        "succession took {took:?}"
    );
    let second_term: u64 = std::fs::read_to_string(env.path("second.term"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        second_term > first_term,
        "terms {first_term} then {second_term}"
    );
    let o = env.run(&["leader", "svc"]);
    let text = stdout(&o);
    assert!(
        text.starts_with(&format!("svc: led by second (term {second_term}, lease ")),
        "{text}"
    );
    let pid = read_pid(&env.path("second.pid")).unwrap();
    kill(second.id(), "TERM");
    let o = wait_output(second, Duration::from_secs(30));
    assert!(
        !alive(pid),
        "the command outlived its leader: {}",
        stderr(&o)
    );
}

/// `leader --watch` prints the current state, then a line per change.
#[test]
fn leader_watch_follows_changes() {
    let env = Env::new("watch");
    let mut watch = env.spawn(&["leader", "--watch", "--json", "jobs"]);
    let stdout = watch.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || -> serde_json::Value {
        let line = lines.recv_timeout(Duration::from_secs(30)).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    assert_eq!(next()["leader"], serde_json::Value::Null);
    let o = env.run(&["elect", "--value", "solo", "jobs", "--", "sleep", "0.5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let led = next();
    assert_eq!(led["leader"]["value"], "solo", "{led}");
    assert_eq!(next()["leader"], serde_json::Value::Null);
    kill(watch.id(), "INT");
    let o = wait_output(watch, Duration::from_secs(10));
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A command alone on fresh keys is never refused, however short `--wait`: each run is
/// granted (exit 0). A deadline shorter than one round trip once cut the attempt short, and
/// the refusal named distlock's own grant, or its own mark, as the holder.
fn short_waits_on_fresh_keys(env: &Env) {
    let mut refused = Vec::new();
    for n in 0..12 {
        let wait = if n % 2 == 0 { "0s" } else { "2ms" };
        let key = format!("fresh-{n}");
        let o = env.run(&["exec", "--wait", wait, &key, "--", "true"]);
        if !o.status.success() {
            refused.push(format!("{key} --wait {wait}: {}", stderr(&o)));
        }
    }
    assert!(refused.is_empty(), "refused: {refused:#?}");
}

#[test]
fn sqlite_short_waits_on_fresh_keys() {
    short_waits_on_fresh_keys(&Env::new("short-waits"));
}

#[cfg(feature = "redis")]
#[test]
fn redis_short_waits_on_fresh_keys() {
    let url = std::env::var("DISTLOCK_TEST_REDIS_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_REDIS_URL)");
    short_waits_on_fresh_keys(&Env::with_url("redis-short-waits", url));
}

/// A SQLite path whose directory does not exist is refused with one line naming it, and
/// nothing is created: a mistyped path must not become a second store. `~/` is the home
/// directory, not a directory named `~`.
#[test]
fn sqlite_paths_are_checked_not_created() {
    let env = Env::new("paths");
    let missing = env.path("no/such/dir");
    let url = format!("sqlite:{}/locks.db", missing.display());
    let o = env.run(&["--url", &url, "exec", "k", "--", "true"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains("which does not exist") && err.contains(&missing.display().to_string()),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        !env.path("no").exists(),
        "the missing directory was created"
    );

    let home = env.path("home");
    std::fs::create_dir_all(&home).unwrap();
    let o = env
        .cmd()
        .args(["--url", "sqlite:~/locks.db", "exec", "k", "--", "true"])
        .env("HOME", &home)
        .current_dir(&env.dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(home.join("locks.db").exists(), "not in the home directory");
    assert!(!env.path("~").exists(), "a directory named ~ was made");

    let o = env.run(&["--url", "sqlite:~root/locks.db", "status", "k"]);
    assert_eq!(o.status.code(), Some(78), "{}", stderr(&o));
    assert!(stderr(&o).contains("`~/`"), "{}", stderr(&o));
}

/// `status` takes several keys: a line each (and the store once), a JSON line each, and the
/// conflict code when any of them is held.
#[test]
fn status_shows_each_key() {
    let env = Env::new("status-keys");
    let store = env.url.clone();
    let o = env.run(&["status", "a", "b"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("a: free\nb: free\nstore: {store}\n"));
    let stop = env.path("stop");
    let mut holder = env.spawn(&["exec", "b", "--", "sh", "-c", &hold_until(&stop)]);
    wait_for("b held", Duration::from_secs(30), || held(&env, "b"));
    let o = env.run(&["status", "a", "b"]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "a: free");
    assert!(
        lines[1].starts_with("b: held by ") && lines[1].contains("fencing token"),
        "{text}"
    );
    let o = env.run(&["status", "--json", "a", "b"]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let values: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(values.len(), 2, "{values:?}");
    assert_eq!(
        (values[0]["key"].as_str(), values[0]["held"].as_bool()),
        (Some("a"), Some(false))
    );
    assert_eq!(
        (values[1]["key"].as_str(), values[1]["held"].as_bool()),
        (Some("b"), Some(true))
    );
    std::fs::write(&stop, "").unwrap();
    assert!(holder.wait().unwrap().success());
}

/// `status` names the store it looked in (a mistyped path is another store, where every
/// key is free), in text and JSON; `exec -v` names it, and when the lock was taken and
/// released.
#[test]
fn status_and_exec_verbose_name_the_store() {
    let env = Env::new("names-store");
    let store = env.url.clone();
    let o = env.run(&["status", "k"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("k: free\nstore: {store}\n"));
    let o = env.run(&["status", "--json", "k"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["store"], store.as_str(), "{v}");

    let o = env.run(&["exec", "-v", "k", "--", "echo", "ran"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "ran\n");
    let said = stderr(&o);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 3, "{said}");
    assert_eq!(lines[0], format!("distlock: lock store {store}"));
    assert!(
        lines[1].starts_with("distlock: took k (fencing token "),
        "{said}"
    );
    assert_eq!(lines[2], "distlock: released k");
    // Without -v: nothing on stderr.
    let o = env.run(&["exec", "k", "--", "true"]);
    assert_eq!(stderr(&o), "");

    // A password is never shown.
    let o = env.run(&[
        "--url",
        "redis://u:hunter2@127.0.0.1:1/",
        "exec",
        "-v",
        "k",
        "--",
        "true",
    ]);
    assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
}

/// A store this user may not write is one cause with one exit code (77) and one line that
/// names the path and says "Permission denied": a read-only database file, a directory
/// where the file cannot be created, and the default store's directory.
#[cfg(unix)]
#[test]
fn a_store_this_user_cannot_write_is_permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    let env = Env::new("denied");
    let set = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // Root may write anything: as root, the commands run as nobody, from a link to the
    // binary that nobody can reach.
    let root = unsafe { libc::geteuid() } == 0;
    let bin = env.path("distlock");
    if std::fs::hard_link(BIN, &bin).is_err() {
        std::fs::copy(BIN, &bin).unwrap();
    }
    set(&env.dir, 0o755);
    let denied = |home: &Path, args: &[&str]| -> String {
        let mut c = Command::new(&bin);
        c.args(args)
            .env_remove("DISTLOCK_URL")
            .env_remove("DISTLOCK_LOG")
            .env_remove("XDG_STATE_HOME")
            .env("HOME", home)
            .current_dir("/");
        if root {
            c.uid(65534).gid(65534);
        }
        let o = wait_output(
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            Duration::from_secs(60),
        );
        let said = stderr(&o);
        // Every case: one line, exit 77, and what to do.
        assert_eq!(o.status.code(), Some(77), "{said}");
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(said.contains("use a store this user can write"), "{said}");
        said
    };

    // A database this user may read but not write, in a directory anyone may write.
    let open = env.path("open");
    std::fs::create_dir(&open).unwrap();
    set(&open, 0o777);
    let db = open.join("locks.db");
    let url = format!("sqlite:{}", db.display());
    let o = env.run(&["--url", &url, "status", "k"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for entry in std::fs::read_dir(&open).unwrap() {
        set(&entry.unwrap().path(), 0o444);
    }
    let said = denied(&open, &["--url", &url, "exec", "k", "--", "true"]);
    assert!(
        said.contains(&format!("cannot write {}: Permission denied", db.display())),
        "{said}"
    );

    // A directory where the file cannot be created.
    let closed = env.path("closed");
    std::fs::create_dir(&closed).unwrap();
    set(&closed, 0o555);
    let new = closed.join("locks.db");
    let url = format!("sqlite:{}", new.display());
    let said = denied(&open, &["--url", &url, "exec", "k", "--", "true"]);
    assert!(
        said.contains(&format!("cannot create {} in its directory", new.display()))
            && said.contains("Permission denied"),
        "{said}"
    );

    // The default store, in a home directory this user may not write.
    let said = denied(&closed, &["exec", "k", "--", "true"]);
    assert!(
        said.contains("the default lock store's directory: Permission denied"),
        "{said}"
    );
}

/// `KEY=VALUE` lines (as `env` prints them) as pairs.
fn env_vars(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The fencing token `status --json` shows for a held key.
fn status_token(env: &Env, key: &str) -> u64 {
    let o = env.run(&["status", "--json", key]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("status failed ({e}): {}", stderr(&o)));
    v["fencing_token"]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} not held: {v}"))
}

/// `exec` with several keys holds each of them while the command runs (others see each
/// held, and an `exec` on any of them is refused), gives the command each key's token in
/// numbered variables in the order given (not one DISTLOCK_KEY or DISTLOCK_FENCING_TOKEN,
/// not those of an enclosing `exec`), and releases them all after.
fn a_set_is_held_while_the_command_runs(env: &Env) {
    // A space, `=`, and an order that is not the one the set takes them in.
    let keys = ["set:b c", "set:a=1", "set:c"];
    let (started, stop, seen) = (env.path("started"), env.path("stop"), env.path("env"));
    let script = format!(
        "env > {seen}; touch {started}; {hold}",
        seen = seen.display(),
        started = started.display(),
        hold = hold_until(&stop)
    );
    let mut args = vec!["exec", "--label", "set-holder"];
    args.extend(keys);
    args.extend(["--", "sh", "-c", &script]);
    // As if run by a command that an enclosing `distlock exec` runs.
    let holder = env
        .cmd()
        .args(&args)
        .env("DISTLOCK_KEY", "outer")
        .env("DISTLOCK_FENCING_TOKEN", "5")
        .env("DISTLOCK_KEY_4", "outer")
        .env("DISTLOCK_FENCING_TOKEN_4", "5")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the command to start", Duration::from_secs(30), || {
        started.exists()
    });
    for key in keys {
        assert!(held(env, key), "{key} is not held");
        let o = env.run(&["exec", key, "--", "true"]);
        assert_eq!(o.status.code(), Some(75), "{key}: {}", stderr(&o));
        assert!(stderr(&o).contains("set-holder"), "{}", stderr(&o));
    }
    let vars = env_vars(&std::fs::read_to_string(&seen).unwrap());
    assert_eq!(
        vars.get("DISTLOCK_KEY_COUNT").map(String::as_str),
        Some("3")
    );
    for (n, key) in keys.iter().enumerate() {
        let n = n + 1;
        assert_eq!(
            vars.get(&format!("DISTLOCK_KEY_{n}")).map(String::as_str),
            Some(*key),
            "{vars:?}"
        );
        let token: u64 = vars[&format!("DISTLOCK_FENCING_TOKEN_{n}")]
            .parse()
            .unwrap();
        assert_eq!(token, status_token(env, key), "the token of {key}");
    }
    assert_eq!(
        vars.get("DISTLOCK_MODE").map(String::as_str),
        Some("exclusive")
    );
    for name in [
        "DISTLOCK_KEY",
        "DISTLOCK_FENCING_TOKEN",
        "DISTLOCK_KEY_4",
        "DISTLOCK_FENCING_TOKEN_4",
        "DISTLOCK_URL",
    ] {
        assert!(!vars.contains_key(name), "the command saw {name}: {vars:?}");
    }
    std::fs::write(&stop, "").unwrap();
    let o = wait_output(holder, Duration::from_secs(30));
    assert!(o.status.success(), "{}", stderr(&o));
    for key in keys {
        assert!(!held(env, key), "{key} was left held");
    }
}

#[test]
fn sqlite_a_set_is_held_while_the_command_runs() {
    a_set_is_held_while_the_command_runs(&Env::new("set-held"));
}

#[cfg(feature = "redis")]
#[test]
fn redis_a_set_is_held_while_the_command_runs() {
    let url = std::env::var("DISTLOCK_TEST_REDIS_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_REDIS_URL)");
    a_set_is_held_while_the_command_runs(&Env::with_url("redis-set-held", url));
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_a_set_is_held_while_the_command_runs() {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_POSTGRES_URL)");
    a_set_is_held_while_the_command_runs(&Env::with_url("postgres-set-held", url));
}

/// One key of a set held by another process: without --wait the set is refused at once,
/// with --wait it is refused when the wait runs out, each time with one line naming the
/// holder and nothing of the set left held; a waiting set runs once the key is released.
#[test]
fn a_set_with_a_held_key_waits_and_holds_none() {
    let env = Env::new("set-conflict");
    let stop = env.path("stop");
    let ran = env.path("ran");
    let ran_arg = ran.to_str().unwrap();
    let holder = env.spawn(&[
        "exec",
        "--label",
        "night-report",
        "b",
        "--",
        "sh",
        "-c",
        &hold_until(&stop),
    ]);
    wait_for("b held", Duration::from_secs(30), || held(&env, "b"));
    let o = env.run(&["exec", "a", "b", "c", "--", "touch", ran_arg]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("b is held by night-report") && err.contains("took none of a, b, c"),
        "{err}"
    );
    for key in ["a", "c"] {
        assert!(!held(&env, key), "{key} was left held");
    }
    let asked = Instant::now();
    let o = env.run(&[
        "exec",
        "--wait",
        "300ms",
        "--conflict-exit-code",
        "9",
        "c",
        "b",
        "a",
        "--",
        "touch",
        ran_arg,
    ]);
    assert_eq!(o.status.code(), Some(9), "{}", stderr(&o));
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    let err = stderr(&o);
    assert!(
        err.contains("gave up after waiting 300ms (--wait) for c, b, a: b is held by night-report"),
        "{err}"
    );
    for key in ["a", "c"] {
        assert!(!held(&env, key), "{key} was left held");
    }
    assert!(!ran.exists(), "the command ran without its locks");
    let waiter = env.spawn(&["exec", "--wait", "60s", "a", "b", "--", "touch", ran_arg]);
    std::fs::write(&stop, "").unwrap();
    let o = wait_output(holder, Duration::from_secs(30));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = wait_output(waiter, Duration::from_secs(60));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(ran.exists());
    for key in ["a", "b"] {
        assert!(!held(&env, key), "{key} was left held");
    }
}

/// A key of the set broken under a running command: the command is stopped (SIGTERM to
/// its group), distlock exits 79 naming the key, and releases the rest.
#[test]
fn a_lost_key_of_a_set_stops_the_command() {
    let env = Env::new("set-lost");
    let pidfile = env.path("child.pid");
    let termfile = env.path("got-term");
    let script = format!(
        "trap 'echo term > {t}; exit 0' TERM; echo $$ > {p}; while :; do sleep 0.05; done",
        t = termfile.display(),
        p = pidfile.display()
    );
    let holder = env.spawn(&["exec", "--ttl", "3s", "a", "b", "--", "sh", "-c", &script]);
    wait_for("the child to start", Duration::from_secs(10), || {
        read_pid(&pidfile).is_some()
    });
    let o = env.run(&["release", "--force", "b"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let broken = Instant::now();
    let o = wait_output(holder, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(79), "{}", stderr(&o));
    assert!(
        broken.elapsed() < Duration::from_secs(3),
        "stopping took {:?}",
        broken.elapsed()
    );
    assert!(termfile.exists(), "the command was not sent SIGTERM");
    let said = stderr(&o);
    assert!(
        said.contains("the lock on b was lost while the command ran; the command was stopped"),
        "{said}"
    );
    assert!(!held(&env, "a"), "the rest of the set was left held");
}

/// A set that names a key twice, has an invalid key, or asks for what only one key can
/// have is refused with one line and exit 64 before anything is taken (before the store
/// is even opened: here it cannot be).
#[test]
fn bad_sets_are_refused_before_anything_is_taken() {
    let env = Env::new("set-bad");
    let ran = env.path("ran");
    let ran_arg = ran.to_str().unwrap();
    let long = "k".repeat(256);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["a", "b", "a"], "the key \"a\" is given twice"),
        (vec!["a", ""], "key 2 (\"\")"),
        (vec!["a", &long], "the key is 256 bytes long"),
        (vec!["a", "b\u{1}"], "key 2 (\"b\\u{1}\")"),
        (vec!["--limit", "2", "a", "b"], "--limit takes one key"),
    ];
    let missing = format!("sqlite:{}", env.path("no-such-dir/locks.db").display());
    for (url, code_if_valid) in [(env.url.as_str(), 0), (missing.as_str(), 78)] {
        for (keys, needle) in &cases {
            let mut args = vec!["--url", url, "exec"];
            args.extend(keys);
            args.extend(["--", "touch", ran_arg]);
            let o = env.run(&args);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(64), "{args:?}: {err}");
            assert!(err.contains(needle), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
        // The same store with good keys: taken (0), or not there at all (78).
        let o = env.run(&["--url", url, "exec", "a", "b", "--", "true"]);
        assert_eq!(o.status.code(), Some(code_if_valid), "{}", stderr(&o));
    }
    assert!(!ran.exists(), "a command ran");
    for key in ["a", "b"] {
        assert!(!held(&env, key), "{key} was left held");
    }
}

/// `--shared` sets share every key with each other and keep out an exclusive command on
/// any of them; their command is told the mode.
#[test]
fn shared_sets_share_and_exclude_a_writer() {
    let env = Env::new("set-shared");
    let stop = env.path("stop");
    let mode = env.path("mode");
    let script = format!(
        "echo $DISTLOCK_MODE > {m}; {hold}",
        m = mode.display(),
        hold = hold_until(&stop)
    );
    let readers: Vec<Child> = [["a", "b"], ["b", "a"]]
        .iter()
        .map(|keys| {
            let mut args = vec!["exec", "--shared"];
            args.extend(keys);
            args.extend(["--", "sh", "-c", &script]);
            env.spawn(&args)
        })
        .collect();
    wait_for("two readers of each key", Duration::from_secs(30), || {
        holder_count(&env, "a") == 2 && holder_count(&env, "b") == 2
    });
    let o = env.run(&["exec", "a", "--", "true"]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("shared by 2 readers"), "{}", stderr(&o));
    std::fs::write(&stop, "").unwrap();
    for reader in readers {
        let o = wait_output(reader, Duration::from_secs(30));
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read_to_string(&mode).unwrap().trim(), "shared");
    assert!(!held(&env, "a") && !held(&env, "b"));
}
