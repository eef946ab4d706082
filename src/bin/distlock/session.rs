//! A distlock that leads its session supervises `exec` from outside, in a worker process.
//!
//! While its command has the terminal, distlock joins the command's process group to hear
//! Ctrl-C (see `terminal`). A session leader cannot change its group (setpgid fails with
//! EPERM), and a shell that `exec`s distlock makes it one: `ssh -t host 'distlock exec …'`,
//! `tmux new-window 'distlock exec …'`, `script -c 'exec distlock …'`, a getty's login. So
//! such a distlock runs itself again, before it has a thread or a lock, as a plain child in
//! its own process group: that worker is not a session leader, and does everything
//! `exec` does (it takes the lock, runs the command, joins its group). This process, the one
//! the shell and the user see, only passes the signals sent to it on to the worker and exits
//! as the worker does.
//!
//! The worker is told that it is one by [`MARKER`] in its environment, holding this
//! process's pid; it removes the marker at once, so its command never sees it.
//!
//! Keeping the command in distlock's own group instead (and killing "the group but me" at
//! `--kill-after`) would make the command a different kind of job from the other
//! placements: it would not lead its group, so `kill -CONT -GROUP` and the group signals
//! would reach distlock too, and the group would have to be walked in /proc to kill it,
//! which races with the command forking.

use std::sync::atomic::{AtomicU32, Ordering};

/// Set in the worker's environment: the pid of the session leader that supervises it.
const MARKER: &str = "DISTLOCK_INTERNAL_SUPERVISOR_PID";

/// The supervising session leader's pid, in a worker (0: not a worker).
static SUPERVISOR: AtomicU32 = AtomicU32::new(0);

/// Removes [`MARKER`] from the environment and records whether this process is a worker
/// (the marker names its parent: one inherited from elsewhere is dropped and means
/// nothing). Must run first thing in `main`, while the process has a single thread:
/// changing the environment races with any other thread reading it.
pub fn adopt() {
    let Some(value) = std::env::var_os(MARKER) else {
        return;
    };
    std::env::remove_var(MARKER);
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    let named = value.to_str().and_then(|v| v.parse::<u32>().ok());
    if parent > 1 && named == Some(parent as u32) {
        SUPERVISOR.store(parent as u32, Ordering::SeqCst);
        name_as_run();
    }
}

/// Names the worker (in `ps`, `top`) as the kernel named the process the user ran: after
/// the file run, which for the worker is `/proc/self/exe` (it shows as `exe`). argv[0] is
/// the user's, passed on.
fn name_as_run() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let Some(argv0) = std::env::args_os().next() else {
            return;
        };
        let path = std::path::Path::new(&argv0);
        let Some(base) = path.file_name() else {
            return;
        };
        // The kernel keeps 15 bytes of a name, and a NUL ends it.
        let mut name = [0u8; 16];
        let bytes = base.as_bytes();
        let len = bytes.len().min(15);
        name[..len].copy_from_slice(&bytes[..len]);
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from a
        // buffer that lives through the call. A name it cannot set is only cosmetic.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
        }
    }
}

/// The pid people know distlock by: the supervising session leader's in a worker, else
/// this process's. A signal sent to either ends the command the same way.
pub fn shown_pid() -> u32 {
    match SUPERVISOR.load(Ordering::SeqCst) {
        0 => std::process::id(),
        pid => pid,
    }
}

/// Runs this same distlock command in a worker if this process leads its session and has a
/// controlling terminal (that it could give the command), and returns the code to exit
/// with: the worker's. `None`: carry on in this process, as distlock did before workers
/// (not a session leader, no terminal, or the worker could not be started).
///
/// Must run before any thread exists: the signal mask set here must be every thread's, and
/// the worker's death signal is tied to the thread that spawns it, which must live as long
/// as this process (the main thread, waiting here).
#[cfg(target_os = "linux")]
pub fn supervise() -> Option<u8> {
    use std::os::unix::process::CommandExt;

    if SUPERVISOR.load(Ordering::SeqCst) != 0 {
        return None;
    }
    // SAFETY: getsid(0) and getpid cannot fail for the calling process.
    if unsafe { libc::getsid(0) != libc::getpid() } {
        return None;
    }
    // No terminal, no group to join: a daemon's distlock (systemd, setsid) stays one process.
    if std::fs::File::open("/dev/tty").is_err() {
        return None;
    }
    let watched = Watched::block()?;
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| "distlock".into());
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0(argv0).args(args);
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    cmd.env(MARKER, me.to_string());
    let (mask, chld) = (watched.mask, watched.chld);
    // SAFETY: only async-signal-safe calls (pthread_sigmask, sigaction, prctl, getppid,
    // raise) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // The worker starts with the mask and SIGCHLD disposition distlock started with
            // (std cleared the mask before this runs), as if it had been run directly.
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            libc::sigaction(libc::SIGCHLD, &chld, std::ptr::null_mut());
            // The worker holds the lock and runs the command: it must not outlive the
            // process the user sees (and may kill), even if that dies by SIGKILL.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // This process may have died between fork and prctl: then no signal would come.
            if libc::getppid() != me {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
    let worker = match cmd.spawn() {
        Ok(child) => child.id() as libc::pid_t,
        Err(_) => {
            // Not fatal: distlock runs the command itself, as it did before workers (Ctrl-C
            // then reaches the command alone).
            watched.restore();
            return None;
        }
    };
    Some(watched.relay(worker))
}

/// Workers are for Linux only, where `signals` tells the terminal's signals from others.
#[cfg(not(target_os = "linux"))]
pub fn supervise() -> Option<u8> {
    None
}

/// The signals the supervising process waits for, blocked (so that none acts on it, and
/// none is lost before it waits), with what to restore.
#[cfg(target_os = "linux")]
struct Watched {
    set: libc::sigset_t,
    /// The signal mask before.
    mask: libc::sigset_t,
    /// SIGCHLD's disposition before.
    chld: libc::sigaction,
}

#[cfg(target_os = "linux")]
impl Watched {
    /// Those passed on to the worker, and SIGCHLD for its end.
    const SIGNALS: [libc::c_int; 6] = [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGCONT,
        libc::SIGCHLD,
    ];

    fn block() -> Option<Watched> {
        // SAFETY: sigemptyset, sigaddset, sigaction and pthread_sigmask on local structs;
        // the process has one thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in Self::SIGNALS {
                libc::sigaddset(&mut set, signal);
            }
            // SIGCHLD's default action: an inherited SIG_IGN would reap the worker
            // unseen, and its exit status with it.
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            let mut chld: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGCHLD, &default, &mut chld) != 0 {
                return None;
            }
            let mut mask: libc::sigset_t = std::mem::zeroed();
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut mask) != 0 {
                libc::sigaction(libc::SIGCHLD, &chld, std::ptr::null_mut());
                return None;
            }
            Some(Watched { set, mask, chld })
        }
    }

    /// Passes the signals sent to this process on to `worker` until it ends; returns the
    /// code to exit with: the worker's, or 128 + the signal that killed it, as a shell
    /// shows it.
    fn relay(self, worker: libc::pid_t) -> u8 {
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own child, with a local for its status.
            match unsafe { libc::waitpid(worker, &mut status, libc::WNOHANG) } {
                0 => {}
                r if r == worker => {
                    if libc::WIFEXITED(status) {
                        return libc::WEXITSTATUS(status) as u8;
                    }
                    if libc::WIFSIGNALED(status) {
                        return (128 + libc::WTERMSIG(status)).min(255) as u8;
                    }
                    continue;
                }
                // ECHILD: nothing left to wait for, which cannot be while the worker runs.
                _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {
                    continue
                }
                _ => return crate::codes::SOFTWARE,
            }
            // SAFETY: sigtimedwait on a blocked set, filling a local siginfo_t. The timeout
            // only bounds a wait that SIGCHLD should end anyway.
            let (signal, info) = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let timeout = libc::timespec {
                    tv_sec: 1,
                    tv_nsec: 0,
                };
                (libc::sigtimedwait(&self.set, &mut info, &timeout), info)
            };
            if signal <= 0 || signal == libc::SIGCHLD {
                continue;
            }
            if Self::pass_on(signal, info.si_code) {
                // SAFETY: kill(2) on our own child, not yet reaped (so its pid is still
                // its own).
                unsafe {
                    libc::kill(worker, signal);
                }
            }
        }
    }

    /// Unblocks the signals again, to carry on without a worker. Not after [`relay`]: a
    /// signal still pending then would end this process by its default action, instead of
    /// with the worker's code.
    ///
    /// [`relay`]: Watched::relay
    fn restore(&self) {
        // SAFETY: restores the mask and disposition saved in `block`, with one thread.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.mask, std::ptr::null_mut());
            libc::sigaction(libc::SIGCHLD, &self.chld, std::ptr::null_mut());
        }
    }

    /// Whether `signal`, sent here as `code` says, is for the worker to hear from us.
    fn pass_on(signal: libc::c_int, code: libc::c_int) -> bool {
        match signal {
            // Sent to whom the user knows as distlock: the worker acts on them as if sent
            // to it. A hangup is signalled by the kernel to the session leader alone.
            libc::SIGTERM | libc::SIGHUP => true,
            // From the terminal (the kernel) to this process's group: the worker is in that
            // group whenever it has the terminal (it leaves the command's group before it
            // takes the terminal back), so it heard the key itself. The SIGCONT that comes
            // with a hangup goes along with the SIGHUP passed on.
            _ => code != libc::SI_KERNEL,
        }
    }
}
