//! Where a signal distlock received came from, so that it passes on only what its command
//! did not get already.
//!
//! While the command has the terminal, distlock is a member of the command's process group
//! (see `terminal`), so that Ctrl-C, Ctrl-\ and a hangup reach distlock as they reach the
//! command. Such a signal, sent by the kernel for the terminal, reached the command too:
//! passing it on would deliver it twice, and many programs take a second Ctrl-C as "quit
//! now, skip the cleanup". And a signal distlock sends the group reaches distlock itself:
//! passing that on again would echo for ever.
//!
//! The tokio signal streams say only that a signal came. An action registered here first
//! (signal-hook-registry runs a signal's actions in the order they were registered, and
//! tokio registers its own through it at its first listener) records each delivery's
//! origin before tokio's action wakes the listener, which then reads it with [`heard`].

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::OnceLock;

/// The signals whose origin is recorded: those distlock passes on to the command's group.
const WATCHED: [libc::c_int; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGCONT,
];

/// Sent by the kernel (the terminal) while distlock was in the command's group: the
/// command's group got it too.
const TERMINAL: u8 = 1;
/// Sent by anyone else (a process other than distlock, or the terminal while distlock was
/// in its own group): the command may not have it.
const ELSEWHERE: u8 = 2;

/// Per signal of [`WATCHED`], the origins seen since the last [`heard`].
static SEEN: [AtomicU8; 5] = [const { AtomicU8::new(0) }; 5];

/// The command's process group (0: none yet).
static COMMAND_GROUP: AtomicI32 = AtomicI32::new(0);

/// Where the signals delivered since the last look came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    /// From the terminal, to the command's group with distlock in it.
    pub terminal: bool,
    /// From elsewhere: the command may not have had it.
    pub elsewhere: bool,
}

/// Listens for `signal` (one of those distlock passes on to the command's group), recording
/// where each delivery came from for [`heard`]. The recording starts before tokio's first
/// listener for it, so it must be the first listener for `signal` in the process.
pub fn listen(signal: libc::c_int) -> io::Result<tokio::signal::unix::Signal> {
    static INSTALLED: [OnceLock<Result<(), String>>; 5] = [const { OnceLock::new() }; 5];
    let Some(at) = WATCHED.iter().position(|&s| s == signal) else {
        return Err(io::Error::other(format!("signal {signal} is not watched")));
    };
    INSTALLED[at]
        .get_or_init(|| {
            // SAFETY: the action runs in a signal handler and does only async-signal-safe
            // work: it reads a siginfo_t, calls getpid and getpgrp, and sets atomics.
            let registered = unsafe {
                signal_hook_registry::register_sigaction(signal, move |info| record(at, info))
            };
            registered.map(drop).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(io::Error::other)?;
    // What came before this listener (an earlier one's leftovers) is not for it.
    SEEN[at].store(0, Ordering::SeqCst);
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(signal))
}

/// Runs in the signal handler: only async-signal-safe calls.
fn record(at: usize, info: &libc::siginfo_t) {
    // SAFETY: getpid and getpgrp cannot fail and are async-signal-safe; si_pid is set for
    // SI_USER (kill), the only code it is read for.
    let (me, my_group, from) = unsafe {
        let from = if info.si_code == libc::SI_USER {
            Some(info.si_pid())
        } else {
            None
        };
        (libc::getpid(), libc::getpgrp(), from)
    };
    if from == Some(me) {
        // distlock's own signal to the group it is in.
        return;
    }
    let group = COMMAND_GROUP.load(Ordering::SeqCst);
    let origin = if from_kernel(info) && group != 0 && my_group == group {
        TERMINAL
    } else {
        ELSEWHERE
    };
    SEEN[at].fetch_or(origin, Ordering::SeqCst);
}

/// Whether the kernel sent the signal (for the terminal: a key, a hangup), not a process.
#[cfg(target_os = "linux")]
fn from_kernel(info: &libc::siginfo_t) -> bool {
    info.si_code == libc::SI_KERNEL
}

/// Not told apart here: distlock does not join the command's group (see `terminal`).
#[cfg(not(target_os = "linux"))]
fn from_kernel(_: &libc::siginfo_t) -> bool {
    false
}

/// Tells the handler which group is the command's, to know that distlock is in it.
pub fn command_group(group: libc::pid_t) {
    COMMAND_GROUP.store(group, Ordering::SeqCst);
}

/// Where the deliveries of `signal` since the last call came from (and forgets them).
pub fn heard(signal: libc::c_int) -> Heard {
    let seen = WATCHED
        .iter()
        .position(|&s| s == signal)
        .map_or(ELSEWHERE, |at| SEEN[at].swap(0, Ordering::SeqCst));
    Heard {
        terminal: seen & TERMINAL != 0,
        elsewhere: seen & ELSEWHERE != 0,
    }
}
