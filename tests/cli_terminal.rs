//! The `distlock` command at a terminal, as a person sees it.
//!
//! Each test runs the built binary under a pseudo-terminal that the test creates itself
//! (util-linux `script`, in Debian's essential `bsdutils`), so it runs the same in CI, which
//! has no terminal, and renders what the binary draws with a terminal emulator (`vt100`):
//! the assertions are on the screen, not on the bytes.
#![cfg(all(feature = "cli", feature = "sqlite"))]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");
const ROWS: u16 = 24;
const COLS: u16 = 160;
/// Bound on every run: a test never waits longer than this for the terminal.
const LIMIT: Duration = Duration::from_secs(60);

/// A temp dir with a SQLite store, removed on drop.
struct Store {
    dir: PathBuf,
    url: String,
}

impl Store {
    fn new(name: &str) -> Store {
        let dir =
            std::env::temp_dir().join(format!("distlock-terminal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite:{}", dir.join("locks.sqlite3").display());
        Store { dir, url }
    }

    /// Holds `key` from a plain (non-terminal) distlock until [`Holder::release`].
    fn hold(&self, key: &str, label: &str) -> Holder {
        let started = self.dir.join(format!("{key}.started"));
        let child = Command::new(BIN)
            .env("DISTLOCK_URL", &self.url)
            .env_remove("DISTLOCK_LOG")
            .args(["exec", "--label", label, key, "--", "sh", "-c"])
            .arg(format!("touch '{}'; read line", started.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !started.exists() {
            assert!(start.elapsed() < LIMIT, "the holder did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Holder { child }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A distlock holding a lock while its command waits for a line on stdin.
struct Holder {
    child: Child,
}

impl Holder {
    /// Closes the command's stdin: it exits and distlock releases the lock.
    fn release(mut self) {
        drop(self.child.stdin.take());
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < LIMIT, "the holder did not finish");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Quotes `s` for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// distlock running on a pseudo-terminal of ROWS x COLS (or as many columns as asked).
struct Terminal {
    script: Child,
    /// What is typed at the terminal, for a terminal started with [`Terminal::shell`].
    keys: Option<ChildStdin>,
    parser: Arc<Mutex<vt100::Parser>>,
    raw: Arc<Mutex<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
}

impl Terminal {
    fn run(store: &Store, env: &[(&str, &str)], args: &[&str]) -> Terminal {
        Terminal::run_cols(store, env, args, COLS)
    }

    fn run_cols(store: &Store, env: &[(&str, &str)], args: &[&str], cols: u16) -> Terminal {
        let mut line = format!("stty rows {ROWS} cols {cols}; exec {}", quote(BIN));
        for a in args {
            line.push(' ');
            line.push_str(&quote(a));
        }
        Terminal::start(store, env, &line, cols, Stdio::null())
    }

    /// Runs the `sh` command line `line` (`$DISTLOCK` is the binary) at a terminal a test
    /// can type at ([`Terminal::type_keys`]).
    fn shell(store: &Store, line: &str) -> Terminal {
        Terminal::shell_cols(store, line, COLS)
    }

    /// [`Terminal::shell`] on a terminal of `cols` columns.
    fn shell_cols(store: &Store, line: &str, cols: u16) -> Terminal {
        let line = format!(
            "stty rows {ROWS} cols {cols}; DISTLOCK={}; {line}",
            quote(BIN)
        );
        let mut term = Terminal::start(store, &[], &line, cols, Stdio::piped());
        term.keys = term.script.stdin.take();
        term
    }

    /// Types `keys` at the terminal (`\r` is Enter, `\x03` Ctrl-C).
    fn type_keys(&mut self, keys: &str) {
        let keys_in = self.keys.as_mut().expect("a terminal from Terminal::shell");
        keys_in.write_all(keys.as_bytes()).unwrap();
        keys_in.flush().unwrap();
    }

    /// The number the screen shows after `name=` (a pid the command line printed).
    fn number_after(&self, name: &str) -> i32 {
        let screen = self.screen();
        let at = screen.find(name).expect("the screen shows the number") + name.len();
        let digits: String = screen[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    }

    fn start(store: &Store, env: &[(&str, &str)], line: &str, cols: u16, stdin: Stdio) -> Terminal {
        let mut cmd = Command::new("script");
        // -q: no banner; -f: flush at once; -e: exit with the command's code.
        cmd.args(["-qfec", line, "/dev/null"])
            .env("SHELL", "/bin/sh")
            .env("TERM", "xterm-256color")
            .env("DISTLOCK_URL", &store.url)
            .env_remove("DISTLOCK_LOG")
            .env_remove("NO_COLOR")
            .env_remove("RUST_BACKTRACE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut script = cmd
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("util-linux `script` runs (Debian: bsdutils)");
        let parser = Arc::new(Mutex::new(vt100::Parser::new(ROWS, cols, 0)));
        let raw = Arc::new(Mutex::new(Vec::new()));
        let mut out = script.stdout.take().unwrap();
        let reader = {
            let (parser, raw) = (parser.clone(), raw.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = out.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    raw.lock().unwrap().extend_from_slice(&buf[..n]);
                    parser.lock().unwrap().process(&buf[..n]);
                }
            })
        };
        Terminal {
            script,
            keys: None,
            parser,
            raw,
            reader: Some(reader),
        }
    }

    fn screen(&self) -> String {
        self.parser.lock().unwrap().screen().contents()
    }

    /// The screen's rows that show anything, as the terminal wraps them (`screen` joins a
    /// wrapped line back into one).
    fn rows_in_use(&self) -> Vec<String> {
        let parser = self.parser.lock().unwrap();
        let (_, cols) = parser.screen().size();
        let rows: Vec<String> = parser.screen().rows(0, cols).collect();
        rows.into_iter().filter(|r| !r.trim().is_empty()).collect()
    }

    /// The processes in the terminal's session, with their groups, states and what they
    /// wait for in the kernel, for a test that failed waiting (empty if `ps` cannot say).
    fn processes(&self) -> String {
        let ps = |args: &[&str]| {
            Command::new("ps")
                .args(args)
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                .unwrap_or_default()
        };
        // `script` starts the session: its child leads it.
        let session = ps(&["-o", "sid=", "--ppid", &self.script.id().to_string()]);
        if session.is_empty() {
            return String::new();
        }
        ps(&[
            "-o",
            "pid,ppid,pgid,sid,tpgid,stat,wchan:24,args",
            "--sid",
            &session,
        ])
    }

    /// Waits until distlock is in its command's process group, which has the terminal: the
    /// command may run (and print) before distlock joins it, and a key typed before that
    /// reaches the command alone.
    fn wait_for_join(&self) {
        let start = Instant::now();
        loop {
            let table = self.processes();
            let rows: Vec<Vec<&str>> = table
                .lines()
                .skip(1)
                .map(|l| l.split_whitespace().collect())
                .filter(|r: &Vec<&str>| r.len() >= 8)
                .collect();
            // pid, ppid, pgid, sid, tpgid, stat, wchan, args...
            let joined = rows.iter().any(|d| {
                d[7].ends_with("distlock")
                    && d[2] == d[4]
                    && rows.iter().any(|c| c[0] == d[2] && c[1] == d[0])
            });
            if joined {
                return;
            }
            if start.elapsed() > LIMIT {
                panic!("distlock never joined its command's group:\n{table}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the screen shows what `f` looks for; returns that screen.
    fn wait_for(&mut self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if f(&screen) {
                return screen;
            }
            if start.elapsed() > LIMIT || self.script.try_wait().unwrap().is_some() {
                let processes = self.processes();
                let _ = self.script.kill();
                panic!(
                    "the terminal never showed {what}; it shows:\n{screen}\n\
                     its processes:\n{processes}"
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for distlock to exit; returns its exit code, the final screen (trailing blank
    /// lines dropped) and every byte it wrote.
    fn finish(mut self) -> (Option<i32>, String, Vec<u8>) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.script.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > LIMIT {
                let processes = self.processes();
                let _ = self.script.kill();
                panic!(
                    "distlock did not exit within {LIMIT:?}; the terminal shows:\n{}\n\
                     its processes:\n{processes}",
                    self.screen()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let screen = self.screen().trim_end().to_owned();
        let raw = self.raw.lock().unwrap().clone();
        (status.code(), screen, raw)
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.script.kill();
        let _ = self.script.wait();
    }
}

fn assert_no_panic(screen: &str) {
    assert!(
        !screen.contains("panicked") && !screen.contains("RUST_BACKTRACE"),
        "distlock panicked:\n{screen}"
    );
}

/// `exec --wait` on a held lock: a spinner names the holder while it waits; when the lock
/// comes free the spinner is cleared and only the command's own output stays on screen.
#[test]
fn exec_shows_a_spinner_while_waiting_then_clears_it() {
    let store = Store::new("spinner");
    let holder = store.hold("job", "night-report");
    let mut term = Terminal::run(
        &store,
        &[],
        &["exec", "--wait", "50s", "job", "--", "echo", "ran"],
    );
    let waiting = term.wait_for("the spinner", |s| s.contains("waiting"));
    assert_no_panic(&waiting);
    let line = waiting.trim();
    assert_eq!(line.lines().count(), 1, "one spinner line:\n{waiting}");
    assert!(
        line.contains("job") && line.contains("held by night-report"),
        "the spinner names the key and the holder:\n{waiting}"
    );
    holder.release();
    assert_only_the_command_output_stays(term);
}

/// Ctrl-C while the spinner shows, on a wide and a narrow terminal: the spinner's row is
/// cleared, and the screen shows one line saying the wait was interrupted and the command
/// not run (exit 130).
#[test]
fn ctrl_c_while_waiting_leaves_one_line() {
    let store = Store::new("spinner-int");
    let key = "reports:quarterly:2026-q4:eu-west-1:consolidated";
    let holder = store.hold(key, "night-report");
    for cols in [COLS, 60] {
        let mut term = Terminal::shell_cols(
            &store,
            &format!(r#"exec "$DISTLOCK" exec --wait 50s {key} -- echo ran"#),
            cols,
        );
        term.wait_for("the spinner", |s| s.contains("(waiting"));
        term.type_keys("\x03");
        let (code, screen, _) = term.finish();
        assert_no_panic(&screen);
        assert_eq!(code, Some(130), "{screen}");
        let rows: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            rows.len(),
            1,
            "{cols} columns: the spinner's row stayed:\n{screen}"
        );
        assert!(
            rows[0].contains("interrupted (SIGINT) while waiting for the lock on"),
            "{screen}"
        );
    }
    holder.release();
}

/// On a terminal too narrow for the whole row, the spinner keeps what matters: the
/// holder's lease and the time waited are shortened, not cut off by a long key.
#[test]
fn the_spinner_keeps_lease_and_wait_on_a_narrow_terminal() {
    let store = Store::new("spinner-narrow");
    let key = "reports:quarterly:2026-q4:eu-west-1:consolidated";
    let holder = store.hold(key, "night-report");
    let mut term = Terminal::run_cols(
        &store,
        &[],
        &["exec", "--wait", "50s", key, "--", "echo", "ran"],
        60,
    );
    let waiting = term.wait_for("the spinner", |s| s.contains("(waiting"));
    assert_no_panic(&waiting);
    let rows = term.rows_in_use();
    assert_eq!(rows.len(), 1, "the spinner wrapped:\n{}", rows.join("\n"));
    let row = &rows[0];
    for part in ["night-report", "left", "waiting"] {
        assert!(row.contains(part), "{part:?} is not on the row: {row:?}");
    }
    holder.release();
    let (code, screen, raw) = term.finish();
    assert_eq!((code, screen.as_str()), (Some(0), "ran"), "{screen}");
    // No frame reaches the row's last columns: the `^C` a terminal echoes there would wrap
    // onto a new row, and the spinner's row would stay above the line that follows.
    let raw = String::from_utf8_lossy(&raw);
    let frames: Vec<String> = raw
        .split("\r")
        .map(visible)
        .filter(|f| f.contains("(waiting"))
        .collect();
    assert!(!frames.is_empty(), "{raw:?}");
    for frame in frames {
        assert!(frame.chars().count() <= 60 - 3, "{frame:?}");
    }
}

/// `text` without its escape sequences (`ESC [ … letter`) and line ends.
fn visible(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            '\n' => {}
            c => out.push(c),
        }
    }
    out
}

/// Once the lock came free: `exec` ran `echo ran` and its spinner left no trace.
fn assert_only_the_command_output_stays(term: Terminal) {
    let (code, screen, _) = term.finish();
    assert_no_panic(&screen);
    assert_eq!(code, Some(0), "{screen}");
    assert_eq!(
        screen, "ran",
        "the spinner was not cleared before the command's output"
    );
}

/// On an 80-column terminal the spinner stays one line (cut at the edge), so each redraw
/// replaces it: a line wrapped in two is not what the spinner clears.
#[test]
fn the_spinner_fits_an_80_column_terminal() {
    let store = Store::new("spinner80");
    let holder = store.hold("invoice:2026-11-27:42", "night-report");
    let mut term = Terminal::run_cols(
        &store,
        &[],
        &[
            "exec",
            "--wait",
            "50s",
            "invoice:2026-11-27:42",
            "--",
            "echo",
            "ran",
        ],
        80,
    );
    let waiting = term.wait_for("the spinner", |s| s.contains("held by night"));
    assert_no_panic(&waiting);
    let line = waiting.trim();
    let rows = term.rows_in_use();
    assert_eq!(
        rows.len(),
        1,
        "the spinner wrapped on 80 columns:\n{}",
        rows.join("\n")
    );
    // What the person waits for, in the order that matters: the key, the holder, its
    // lease's remaining TTL (cut at the edge before, on a terminal of 80 columns).
    let parts = [
        "invoice:2026-11-27:42: ",
        "held by night-report",
        ", lease ",
    ];
    let at: Vec<_> = parts.iter().map(|p| line.find(p)).collect();
    assert!(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        "the spinner's row names the key, the holder and its lease, in that order:\n{waiting}"
    );
    holder.release();
    assert_only_the_command_output_stays(term);
}

/// `status` at a terminal: one plain line for a held key, one for a free key, each
/// followed by the store's.
#[test]
fn status_at_a_terminal() {
    let store = Store::new("status");
    let holder = store.hold("job", "night-report");
    let (code, screen, raw) = Terminal::run(&store, &[], &["status", "job"]).finish();
    assert_no_panic(&screen);
    // Held: 75, as `flock -n` answers 1 (docs/cli.md); free: 0.
    assert_eq!(code, Some(75), "{screen}");
    assert_eq!(screen.lines().count(), 2, "{screen}");
    assert_eq!(
        screen.lines().nth(1),
        Some(format!("store: {}", store.url).as_str())
    );
    assert!(
        screen.starts_with("job: held by night-report (fencing token ")
            && screen.contains("remaining TTL"),
        "{screen}"
    );
    assert!(
        !raw.contains(&0x1b),
        "escape codes in plain output: {raw:?}"
    );
    holder.release();
    let (code, screen, _) = Terminal::run(&store, &[], &["status", "job"]).finish();
    assert_eq!(
        (code, screen.as_str()),
        (Some(0), format!("job: free\nstore: {}", store.url).as_str())
    );
}

/// An error at a terminal: one clear line, the right exit code, no panic, no escape codes.
#[test]
fn error_at_a_terminal() {
    let store = Store::new("error");
    let (code, screen, raw) = Terminal::run(&store, &[], &["exec", "", "--", "true"]).finish();
    assert_no_panic(&screen);
    assert_eq!(code, Some(64), "{screen}");
    assert_eq!(screen.lines().count(), 1, "{screen}");
    assert!(
        screen.starts_with("distlock: ") && screen.contains("key"),
        "{screen}"
    );
    assert!(
        !raw.contains(&0x1b),
        "escape codes in plain output: {raw:?}"
    );
}

/// Debug logging at a terminal works, and NO_COLOR keeps escape codes out of it.
#[test]
fn logging_at_a_terminal() {
    let store = Store::new("logging");
    let (code, screen, raw) = Terminal::run(
        &store,
        &[("DISTLOCK_LOG", "debug"), ("NO_COLOR", "1")],
        &["exec", "job", "--", "echo", "ran"],
    )
    .finish();
    assert_no_panic(&screen);
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.lines().any(|l| l == "ran"), "{screen}");
    assert!(
        String::from_utf8_lossy(&raw).contains("lock acquired"),
        "no debug log: {screen}"
    );
    assert!(
        !raw.contains(&0x1b),
        "escape codes despite NO_COLOR: {raw:?}"
    );
}

/// Whether `key` is held, asked from outside the terminal.
fn held(store: &Store, key: &str) -> bool {
    let out = Command::new(BIN)
        .env("DISTLOCK_URL", &store.url)
        .env_remove("DISTLOCK_LOG")
        .args(["status", key])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with(key), "status: {said}");
    !said.contains(": free")
}

/// A prompt `read` answers, as a command wrapped in `distlock exec` prints it.
const PROMPT: &str = r#"printf "continue? "; read x; echo "got $x""#;

/// How a shell runs distlock at a terminal, as the start of a line before `"$DISTLOCK"`:
/// in the shell's own process group (a script, without job control), in a group of its own
/// (an interactive shell's job), and as the session's leader (`exec`: `ssh host distlock`,
/// `script -c distlock`), which cannot join the command's group and runs `exec` in a worker
/// that can.
const FORMS: [(&str, &str); 3] = [
    ("in the shell's group", ""),
    ("a job of its own", "set -m; "),
    ("the session leader", "exec "),
];

/// The [`FORMS`] in which distlock is not the session leader.
const JOBS: [(&str, &str); 2] = [FORMS[0], FORMS[1]];

/// The line that runs `distlock ARGS` as `start` (of [`FORMS`]) says, then says its exit
/// code (`exit=N`) unless distlock took the shell's place. The shell survives a Ctrl-C
/// that reaches it (with distlock in the shell's group, once distlock took the terminal
/// back): its trap, unlike an ignored signal, is not inherited by distlock.
fn job_line(start: &str, args: &str) -> String {
    format!(r#"trap 'true' INT QUIT; {start}"$DISTLOCK" {args}; echo "exit=$?""#)
}

/// distlock's exit code: the `exit=N` the shell line showed, or the terminal's (distlock
/// took the shell's place).
fn distlocks_code(code: Option<i32>, screen: &str) -> Option<i32> {
    match screen.rfind("exit=") {
        Some(at) => screen[at + 5..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok(),
        None => code,
    }
}

/// distlock ended as SIGKILL's (its `code`, or the `exit=N` the shell printed), `took` after
/// the test asked it to end is `--kill-after` (1 s, give or take a busy machine), and the
/// lock is free: the command was killed and distlock released the lock.
fn killed_after_kill_after(
    store: &Store,
    form: &str,
    code: Option<i32>,
    screen: &str,
    took: Duration,
) {
    assert_eq!(
        distlocks_code(code, screen),
        Some(128 + libc::SIGKILL),
        "{form}: {screen}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{form}: SIGKILL after --kill-after (1s), not {took:?}:\n{screen}"
    );
    assert!(!held(store, "job"), "{form}: the lock was left held");
}

/// (a) The command reads the terminal as under flock(1): it is the foreground job while it
/// runs, and the shell gets the terminal back after it: its own `read`, and the next job's,
/// read the terminal, and nothing distlock started is left in the session.
#[test]
fn a_command_reads_the_terminal() {
    let store = Store::new("prompt");
    for (form, start) in JOBS {
        let mut term = Terminal::shell(
            &store,
            &format!(
                r#"{start}"$DISTLOCK" exec job -- sh -c {}; echo "exit=$?"; printf "after? "; read y; echo "then $y"; sh -c 'printf "next? "; read z; echo "and $z"'; ps -o comm= -s $$"#,
                quote(PROMPT)
            ),
        );
        term.wait_for("the prompt", |s| s.contains("continue?"));
        assert!(
            held(&store, "job"),
            "{form}: the lock is held while the command asks"
        );
        term.type_keys("yes\r");
        term.wait_for("distlock's exit", |s| s.contains("exit="));
        term.type_keys("no\r");
        term.wait_for("the next job", |s| s.contains("next?"));
        term.type_keys("maybe\r");
        let (code, screen, _) = term.finish();
        assert_no_panic(&screen);
        assert_eq!(code, Some(0), "{form}: {screen}");
        assert_eq!(
            screen,
            "continue? yes\ngot yes\nexit=0\nafter? no\nthen no\nnext? maybe\nand maybe\nsh\nps",
            "{form}: the command read the answer, the shell and the next job theirs, and only \
             the shell is left"
        );
        assert!(!held(&store, "job"));
    }
}

/// (c) Ctrl-C and Ctrl-\ at a prompt end the command (the foreground job gets them, as
/// under flock) and distlock exits with the shell's code for the signal.
#[test]
fn ctrl_c_and_ctrl_backslash_at_a_prompt_end_the_command() {
    let store = Store::new("prompt-keys");
    for (form, start) in FORMS {
        for (key, code) in [("\x03", 130), ("\x1c", 131)] {
            let mut term = Terminal::shell(
                &store,
                &format!(r#"{start}"$DISTLOCK" exec job -- sh -c {}"#, quote(PROMPT)),
            );
            term.wait_for("the prompt", |s| s.contains("continue?"));
            term.type_keys(key);
            let (got, screen, _) = term.finish();
            assert_no_panic(&screen);
            assert_eq!(got, Some(code), "{form}, {key:?}:\n{screen}");
            assert!(!screen.contains("got"), "{form}: {screen}");
            assert!(!held(&store, "job"), "{form}: the lock was left held");
        }
    }
}

/// (b) A command stopped at the terminal (Ctrl-Z) is reported on one line; the lock stays
/// held while it waits; (c) Ctrl-C then reaches distlock, which ends the stopped command.
#[test]
fn a_stopped_command_is_reported_and_ctrl_c_ends_it() {
    let store = Store::new("stopped");
    for (form, start) in FORMS {
        let mut term = Terminal::shell(
            &store,
            &job_line(start, &format!("exec job -- sh -c {}", quote(PROMPT))),
        );
        term.wait_for("the prompt", |s| s.contains("continue?"));
        term.type_keys("\x1a");
        let screen = term.wait_for("the stopped line", |s| s.contains("Ctrl-C ends it"));
        let line = screen
            .lines()
            .find(|l| l.contains("distlock:"))
            .unwrap_or_default();
        assert!(
            line.contains(
                "the command is stopped by SIGTSTP and waiting; the lock on job stays held"
            ),
            "{form}: {screen}"
        );
        assert!(
            held(&store, "job"),
            "{form}: the lock is held while the command is stopped"
        );
        let asked = Instant::now();
        term.type_keys("\x03");
        let (code, screen, _) = term.finish();
        assert_no_panic(&screen);
        assert_eq!(distlocks_code(code, &screen), Some(130), "{form}: {screen}");
        // --kill-after is 10s here; the command acts on SIGINT at once, once continued.
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "{form}: {screen}"
        );
        assert!(!held(&store, "job"), "{form}: the lock was left held");
    }
}

/// A command that ignores every signal but SIGKILL, and says when it runs. It starts its
/// one child before it says so and forks no more: dash runs a command with vfork, and a
/// Ctrl-Z that stops the child between vfork and exec leaves the shell waiting in vfork,
/// where it cannot stop, so its stop would never be reported.
const STUBBORN: &str = r#"trap "" INT TERM QUIT HUP; sleep 600 & echo running; wait"#;

/// Ctrl-C at a running command that ignores SIGINT and SIGTERM: distlock, which joined the
/// command's process group to hear the terminal (as the session leader, through its
/// worker), kills the command --kill-after later; the lock is released.
#[test]
fn ctrl_c_kills_a_command_that_ignores_it_after_kill_after() {
    let store = Store::new("stubborn-int");
    for (form, start) in FORMS {
        let mut term = Terminal::shell(
            &store,
            &format!(
                r#"{start}"$DISTLOCK" exec --ttl 6s --kill-after 1s job -- sh -c {}"#,
                quote(STUBBORN)
            ),
        );
        term.wait_for("the command", |s| s.contains("running"));
        term.wait_for_join();
        let asked = Instant::now();
        term.type_keys("\x03");
        let (code, screen, _) = term.finish();
        let took = asked.elapsed();
        assert_no_panic(&screen);
        killed_after_kill_after(&store, form, code, &screen, took);
    }
}

/// Ctrl-Z at a running command that ignores every signal but SIGKILL is reported; Ctrl-C
/// then reaches distlock, which kills the stopped command --kill-after later.
#[test]
fn ctrl_z_then_ctrl_c_kills_a_stopped_command_that_ignores_it() {
    let store = Store::new("stubborn-tstp");
    for (form, start) in FORMS {
        let mut term = Terminal::shell(
            &store,
            &job_line(
                start,
                &format!(
                    "exec --ttl 6s --kill-after 1s job -- sh -c {}",
                    quote(STUBBORN)
                ),
            ),
        );
        term.wait_for("the command", |s| s.contains("running"));
        term.type_keys("\x1a");
        term.wait_for(&format!("{form}: the stopped line"), |s| {
            s.contains("stopped by SIGTSTP") && s.contains("Ctrl-C ends it")
        });
        assert!(
            held(&store, "job"),
            "{form}: the lock is held while stopped"
        );
        let asked = Instant::now();
        term.type_keys("\x03");
        let (code, screen, _) = term.finish();
        let took = asked.elapsed();
        assert_no_panic(&screen);
        killed_after_kill_after(&store, form, code, &screen, took);
    }
}

/// Ctrl-C typed at the terminal reaches a command that handles it once: distlock, in the
/// command's group (as the session leader, through its worker), hears it too but does not
/// send it again (many programs take a second Ctrl-C as "quit now, skip the cleanup"); it
/// kills the command --kill-after later.
#[test]
fn ctrl_c_reaches_the_command_once() {
    let store = Store::new("int-once");
    let counting =
        r#"n=0; trap 'n=$((n+1)); echo "int $n"' INT; echo running; while :; do sleep 0.05; done"#;
    for (form, start) in FORMS {
        let mut term = Terminal::shell(
            &store,
            &format!(
                r#"{start}"$DISTLOCK" exec --ttl 6s --kill-after 1s job -- sh -c {}"#,
                quote(counting)
            ),
        );
        term.wait_for("the command", |s| s.contains("running"));
        term.wait_for_join();
        let asked = Instant::now();
        term.type_keys("\x03");
        term.wait_for("the trap", |s| s.contains("int 1"));
        let (code, screen, _) = term.finish();
        let took = asked.elapsed();
        assert_no_panic(&screen);
        assert!(!screen.contains("int 2"), "{form}: {screen}");
        killed_after_kill_after(&store, form, code, &screen, took);
    }
}

/// SIGCONT and SIGTERM to the pid the shell knew distlock by, where distlock leads its
/// session (and runs `exec` in a worker): the command gets each once; it ignores SIGTERM,
/// and gets SIGKILL --kill-after later; distlock exits as elsewhere (137); the lock is
/// released; the command's environment has nothing of the worker's.
#[test]
fn sigterm_to_a_session_leader_ends_a_command_that_ignores_it() {
    let store = Store::new("leader-term");
    let stubborn = r#"trap 'echo term' TERM; trap 'echo cont' CONT; trap "" INT QUIT HUP; echo "marker=$(env | grep -c DISTLOCK_INTERNAL)"; echo running; while :; do sleep 0.05; done"#;
    let mut term = Terminal::shell(
        &store,
        &format!(
            r#"echo "pid=$$"; exec "$DISTLOCK" exec --ttl 6s --kill-after 1s job -- sh -c {}"#,
            quote(stubborn)
        ),
    );
    let screen = term.wait_for("the command", |s| s.contains("running"));
    assert!(screen.contains("marker=0"), "{screen}");
    assert!(held(&store, "job"));
    let pid = term.number_after("pid=");
    // SAFETY: kill(2) on the distlock this test started (it is the shell, exec'd).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    term.wait_for("the SIGCONT", |s| s.contains("cont"));
    let asked = Instant::now();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (code, screen, _) = term.finish();
    let took = asked.elapsed();
    assert_no_panic(&screen);
    // SIGTERM once; SIGCONT twice: the test's, then the one distlock sends with SIGTERM (a
    // stopped command acts on SIGTERM only once continued).
    assert_eq!(screen.matches("term").count(), 1, "{screen}");
    assert_eq!(screen.matches("cont").count(), 2, "{screen}");
    killed_after_kill_after(&store, "", code, &screen, took);
}

/// SIGCONT and SIGTERM sent to distlock reach the command once: distlock passes them on to
/// the command's group, which it is in while the command has the terminal, and the copy that
/// comes back to distlock is not passed on again.
#[test]
fn signals_to_distlock_reach_the_command_once() {
    let store = Store::new("term-once");
    let counting = r#"c=0; t=0; trap 'c=$((c+1)); echo "cont $c"' CONT; trap 't=$((t+1)); echo "term $t"' TERM; echo "pid=$PPID"; while :; do sleep 0.05; done"#;
    for (form, start) in FORMS {
        let mut term = Terminal::shell(
            &store,
            &job_line(
                start,
                &format!(
                    "exec --ttl 6s --kill-after 1s job -- sh -c {}",
                    quote(counting)
                ),
            ),
        );
        term.wait_for("the command", |s| s.contains("pid="));
        let pid = term.number_after("pid=");
        // SAFETY: kill(2) on the distlock this test started (the command's parent).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        term.wait_for("the SIGCONT", |s| s.contains("cont 1"));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !term.screen().contains("cont 2"),
            "{form}: {}",
            term.screen()
        );
        let asked = Instant::now();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let (code, screen, _) = term.finish();
        let took = asked.elapsed();
        assert_no_panic(&screen);
        assert!(
            screen.contains("term 1") && !screen.contains("term 2"),
            "{form}: {screen}"
        );
        killed_after_kill_after(&store, form, code, &screen, took);
    }
}

/// (c) SIGTERM to distlock ends a stopped command that ignores every signal but SIGKILL,
/// within --kill-after; (b) the stop was reported first.
#[test]
fn sigterm_ends_a_stopped_command_within_kill_after() {
    let store = Store::new("stopped-term");
    let stubborn = r#"trap "" INT TERM QUIT HUP; kill -STOP $$; while :; do sleep 1; done"#;
    let mut term = Terminal::shell(
        &store,
        &format!(
            r#"echo "pid=$$"; exec "$DISTLOCK" exec --ttl 6s --kill-after 1s job -- sh -c {}"#,
            quote(stubborn)
        ),
    );
    term.wait_for("the stopped line", |s| s.contains("stopped by SIGSTOP"));
    let pid = term.number_after("pid=");
    let asked = Instant::now();
    // SAFETY: kill(2) on the distlock this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (code, screen, _) = term.finish();
    let took = asked.elapsed();
    assert_no_panic(&screen);
    killed_after_kill_after(&store, "", code, &screen, took);
}

/// (b) A distlock started in the background (a shell with job control) cannot give its
/// command the terminal: the command's read stops it with SIGTTIN, which distlock reports;
/// `fg` then gives it the terminal and it goes on, and SIGTERM would end it.
#[test]
fn a_background_command_that_reads_the_terminal_is_reported_and_fg_resumes_it() {
    let store = Store::new("background");
    let mut term = Terminal::shell(
        &store,
        &format!(
            r#"set -m; "$DISTLOCK" exec job -- sh -c {} & sleep 0.1; read go; fg; echo "exit=$?""#,
            quote(PROMPT)
        ),
    );
    let screen = term.wait_for("the stopped line", |s| {
        s.contains("stopped by SIGTTIN") && s.contains("resumes it")
    });
    assert!(
        screen.contains(
            "(it read the terminal from the background) and waiting; the lock on job stays held"
        ),
        "{screen}"
    );
    assert!(held(&store, "job"));
    term.type_keys("\r");
    term.wait_for("fg", |s| {
        s.matches("continue?").count() >= 1 && s.contains("sh -c")
    });
    term.type_keys("yes\r");
    let screen = term.wait_for("the answer", |s| s.contains("exit="));
    assert!(
        screen.contains("got yes") && screen.contains("exit=0"),
        "{screen}"
    );
    let (code, screen, _) = term.finish();
    assert_no_panic(&screen);
    assert_eq!(code, Some(0), "{screen}");
}

/// (b) (c) The same background command, stopped by SIGTTIN, ends on SIGTERM to distlock.
#[test]
fn sigterm_ends_a_background_command_stopped_by_sigttin() {
    let store = Store::new("background-term");
    let mut term = Terminal::shell(
        &store,
        &format!(
            r#"set -m; "$DISTLOCK" exec job -- sh -c {} & echo "pid=$!"; wait $!; echo "exit=$?""#,
            quote(PROMPT)
        ),
    );
    term.wait_for("the stopped line", |s| s.contains("stopped by SIGTTIN"));
    let pid = term.number_after("pid=");
    // SAFETY: kill(2) on the distlock this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (code, screen, _) = term.finish();
    assert_no_panic(&screen);
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains("exit=143"), "{screen}");
    assert!(!held(&store, "job"), "the lock was left held");
}

/// (a) (b) A command stopped with Ctrl-Z and resumed with the `kill -CONT` the line names
/// gets the terminal again and reads its answer.
#[test]
fn a_stopped_command_resumed_with_sigcont_reads_the_terminal_again() {
    let store = Store::new("resumed");
    let mut term = Terminal::shell(
        &store,
        &format!(r#"exec "$DISTLOCK" exec job -- sh -c {}"#, quote(PROMPT)),
    );
    term.wait_for("the prompt", |s| s.contains("continue?"));
    term.type_keys("\x1a");
    term.wait_for("the stopped line", |s| s.contains("resumes it"));
    let group = term.number_after("kill -CONT -");
    // SAFETY: kill(2) on the process group of the command this test started.
    assert_eq!(unsafe { libc::kill(-group, libc::SIGCONT) }, 0);
    term.type_keys("yes\r");
    let (code, screen, _) = term.finish();
    assert_no_panic(&screen);
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.ends_with("yes\ngot yes"), "{screen}");
}
