//! The child process: its own process group, killed with distlock, signalled as a group.

use std::io;
use std::process::ExitStatus;

use tokio::process::{Child, Command};

/// Spawns `program args` as the leader of a new process group, with `PR_SET_PDEATHSIG`
/// so that it is killed if distlock dies (even by SIGKILL).
///
/// Must be called from the thread that lives as long as distlock: the death signal is tied
/// to the *thread* that spawned the child, not the process.
pub fn spawn(
    program: &str,
    args: &[String],
    env: &[(&str, String)],
    strip: &[&str],
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
    // SAFETY: only async-signal-safe calls (prctl, getppid, raise) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
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

fn signal_name(sig: libc::c_int) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
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
