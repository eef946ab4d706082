//! The child process: its own process group, killed with distlock, signalled as a group.

use std::io;
use std::process::ExitStatus;

use tokio::process::{Child, Command};

use crate::terminal::ForChild;

/// Spawns `program args` as the leader of a new process group, with `PR_SET_PDEATHSIG`
/// so that it is killed if distlock dies (even by SIGKILL).
///
/// With `terminal`, the child makes its group the terminal's foreground group (if distlock's
/// is) before exec, as a shell's foreground job.
///
/// Must be called from the thread that lives as long as distlock: the death signal is tied
/// to the *thread* that spawned the child, not the process.
pub fn spawn(
    program: &str,
    args: &[String],
    env: &[(String, String)],
    strip: &[String],
    terminal: Option<ForChild>,
) -> io::Result<Child> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for name in strip {
        cmd.env_remove(name);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.process_group(0);
    cmd.kill_on_drop(true);
    // SAFETY: getpid is async-signal-safe and runs before the fork.
    let parent = unsafe { libc::getpid() };
    // SAFETY: only async-signal-safe calls (prctl, getppid, raise, and tcsetpgrp, getpid,
    // sigaction in `in_child`) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(terminal) = &terminal {
                terminal.in_child();
            }
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // distlock may have died between fork and prctl: then no signal would come.
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `signal` to the child's whole process group.
pub fn signal_group(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: plain kill(2) on the group the child leads (pid == pgid).
        unsafe {
            libc::kill(-(pid as libc::pid_t), signal);
        }
    }
}

/// Asks the child's group to end with `signal`, and continues it: a stopped process acts
/// on a signal only once continued.
pub fn end_group(child: &Child, signal: libc::c_int) {
    signal_group(child, signal);
    signal_group(child, libc::SIGCONT);
}

/// A change the child went through without ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Stopped by this signal.
    Stopped(libc::c_int),
    Continued,
}

/// The child's stops and continues since the last call, in order (never its exit, which
/// is left to be collected by `Child::wait`).
pub fn paused(child: &Child) -> Vec<Pause> {
    let mut seen = Vec::new();
    let Some(pid) = child.id() else {
        return seen;
    };
    loop {
        // SAFETY: waitid with a zeroed siginfo_t it fills in. Without WEXITED it reports
        // only stops and continues, and reaps nothing.
        let (r, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WCONTINUED | libc::WNOHANG,
            );
            (r, info)
        };
        // SAFETY: si_pid and si_status are set by waitid for a child's state change.
        let (from, status) = unsafe { (info.si_pid(), info.si_status()) };
        if r != 0 || from == 0 {
            return seen;
        }
        match info.si_code {
            libc::CLD_STOPPED | libc::CLD_TRAPPED => seen.push(Pause::Stopped(status)),
            libc::CLD_CONTINUED => seen.push(Pause::Continued),
            _ => {}
        }
    }
}

/// How the child ended, to follow "the command ": "exited with code 3", "was killed by
/// signal 15 (SIGTERM)".
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => match signal_name(sig) {
            Some(name) => format!("was killed by signal {sig} ({name})"),
            None => format!("was killed by signal {sig}"),
        },
        _ => format!("ended ({status})"),
    }
}

pub fn signal_name(sig: libc::c_int) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        _ => return None,
    })
}

/// The exit code to pass on for a finished child: its code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => (128 + sig).min(255) as u8,
        _ => 1,
    }
}
