//! The controlling terminal, handed to the command as a shell hands it to a foreground job.
//!
//! The command leads its own process group, so that distlock can signal it and everything
//! it started. A group that is not the terminal's foreground group is stopped (SIGTTIN,
//! SIGTTOU) when it reads the terminal or changes its settings: when distlock is itself in
//! the foreground, it makes the command's group the foreground group while the command runs,
//! and takes the terminal back when it ends or stops.
//!
//! The terminal sends what is typed at it (Ctrl-C, Ctrl-\, Ctrl-Z) to its foreground group
//! only. So that distlock sees Ctrl-C and can end a command that ignores it (SIGKILL
//! `--kill-after` later), distlock joins the command's group while that group has the
//! terminal, and goes back to its own group before it takes the terminal back, before it
//! sends the group SIGKILL, and when the command ends. While it is in the command's group it
//! ignores SIGTSTP and SIGTTIN (SIGTTOU it ignores all along): Ctrl-Z stops the command, not
//! distlock, which goes on renewing the lease. A session leader (as under `script -c` or
//! `ssh host distlock ...`) cannot leave its group: it runs all this in a worker process that
//! can (see `session`). A distlock that cannot join all the same (no worker could be started)
//! stays where it is, and Ctrl-C reaches the command alone, as under `flock`.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};

/// distlock's controlling terminal, held while the command runs.
///
/// While it exists SIGTTOU is ignored by distlock: it must be able to give the terminal
/// away and take it back from the background, and a line it prints from the background
/// must not stop it (with `stty tostop`) while it has a lease to renew. The command gets
/// the disposition distlock started with (see [`ForChild`]).
pub struct Terminal {
    tty: File,
    own_group: libc::pid_t,
    /// SIGTTOU's disposition before distlock ignored it.
    ttou: libc::sigaction,
    /// The group the terminal was given to, if it was.
    given_to: Option<libc::pid_t>,
    /// While distlock is in the command's group: SIGTSTP's and SIGTTIN's dispositions from
    /// before distlock ignored them there.
    joined: Option<(libc::sigaction, libc::sigaction)>,
}

/// What the command's process does with the terminal between fork and exec.
#[derive(Clone, Copy)]
pub struct ForChild {
    fd: RawFd,
    /// Make the child's group the foreground group (distlock is in the foreground).
    take: bool,
    ttou: libc::sigaction,
}

impl Terminal {
    /// Opens the controlling terminal; `None` if distlock has none.
    pub fn open() -> Option<Terminal> {
        // O_CLOEXEC (std's default): the command does not inherit it.
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .ok()?;
        // SAFETY: getpgrp cannot fail; sigaction with valid pointers to local structs.
        let (own_group, ttou) = unsafe {
            let mut ignore: libc::sigaction = std::mem::zeroed();
            ignore.sa_sigaction = libc::SIG_IGN;
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGTTOU, &ignore, &mut old) != 0 {
                return None;
            }
            (libc::getpgrp(), old)
        };
        Some(Terminal {
            tty,
            own_group,
            ttou,
            given_to: None,
            joined: None,
        })
    }

    /// Whether distlock's group is the terminal's foreground group.
    pub fn is_foreground(&self) -> bool {
        // SAFETY: tcgetpgrp on an open fd.
        unsafe { libc::tcgetpgrp(self.tty.as_raw_fd()) == self.own_group }
    }

    /// What the command's process does before exec: take the terminal if distlock has it
    /// now, and restore SIGTTOU.
    pub fn for_child(&self) -> ForChild {
        ForChild {
            fd: self.tty.as_raw_fd(),
            take: self.is_foreground(),
            ttou: self.ttou,
        }
    }

    /// Records that the child's process group `group` has (or was meant to get) the terminal,
    /// and joins it to hear the terminal's signals.
    pub fn given(&mut self, child: &ForChild, group: libc::pid_t) {
        if child.take {
            self.given_to = Some(group);
            self.join(group);
        }
    }

    /// Gives the terminal to `group` if distlock's own group has it, and joins the group to
    /// hear the terminal's signals.
    pub fn give(&mut self, group: libc::pid_t) {
        if self.is_foreground() {
            // SAFETY: tcsetpgrp on an open fd; SIGTTOU is ignored.
            if unsafe { libc::tcsetpgrp(self.tty.as_raw_fd(), group) } == 0 {
                self.given_to = Some(group);
                self.join(group);
            }
        }
    }

    /// Moves distlock into the command's process group `group`, which has the terminal, so
    /// that what the terminal sends the command (Ctrl-C) reaches distlock too. If that fails
    /// (distlock leads its session: it does when it could not start a worker, see `session`),
    /// distlock stays where it is, as it was before it joined.
    fn join(&mut self, group: libc::pid_t) {
        // Only where `signals` tells the terminal's signals from others' (Linux): elsewhere
        // distlock would pass each key on to the command a second time.
        if cfg!(not(target_os = "linux")) || self.joined.is_some() || group <= 0 {
            return;
        }
        // SAFETY: sigaction with valid pointers to local structs; setpgid(0, ..) moves only
        // this process. SIGTSTP and SIGTTIN are ignored before the move, so that a Ctrl-Z
        // typed just after it cannot stop distlock.
        unsafe {
            let mut ignore: libc::sigaction = std::mem::zeroed();
            ignore.sa_sigaction = libc::SIG_IGN;
            let mut tstp: libc::sigaction = std::mem::zeroed();
            let mut ttin: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGTSTP, &ignore, &mut tstp) != 0 {
                return;
            }
            if libc::sigaction(libc::SIGTTIN, &ignore, &mut ttin) != 0 {
                libc::sigaction(libc::SIGTSTP, &tstp, std::ptr::null_mut());
                return;
            }
            if libc::setpgid(0, group) == 0 {
                self.joined = Some((tstp, ttin));
            } else {
                libc::sigaction(libc::SIGTSTP, &tstp, std::ptr::null_mut());
                libc::sigaction(libc::SIGTTIN, &ttin, std::ptr::null_mut());
            }
        }
    }

    /// Moves distlock back from the command's group to its own, if it joined it: before it
    /// sends the group SIGKILL, which must not reach distlock. False if distlock is still
    /// in the command's group.
    pub fn leave(&mut self) -> bool {
        let Some((tstp, ttin)) = self.joined else {
            return true;
        };
        // SAFETY: setpgid(0, ..) moves only this process. Back to the group distlock came
        // from: it exists if anyone else is in it (the shell, without job control), and if
        // distlock led it alone its id is distlock's pid, a group distlock may make again.
        // Failing that (it led a pipeline whose leader has exited), a group of its own, as
        // SIGKILL to the command's group must not reach distlock.
        let out = unsafe {
            if libc::setpgid(0, self.own_group) == 0 {
                true
            } else if libc::setpgid(0, 0) == 0 {
                self.own_group = libc::getpgrp();
                true
            } else {
                false
            }
        };
        if out {
            self.joined = None;
            // SAFETY: restores the dispositions saved in `join`, now that the command's
            // Ctrl-Z no longer reaches distlock.
            unsafe {
                libc::sigaction(libc::SIGTSTP, &tstp, std::ptr::null_mut());
                libc::sigaction(libc::SIGTTIN, &ttin, std::ptr::null_mut());
            }
        }
        out
    }

    /// Whether the terminal was given away and not taken back.
    pub fn is_given(&self) -> bool {
        self.given_to.is_some()
    }

    /// Takes the terminal back for distlock's group if it gave it away (leaving the
    /// command's group first: the terminal can go only to a group that has a member).
    pub fn take_back(&mut self) {
        self.leave();
        if self.given_to.take().is_some() {
            // SAFETY: tcsetpgrp on an open fd; SIGTTOU is ignored.
            unsafe {
                libc::tcsetpgrp(self.tty.as_raw_fd(), self.own_group);
            }
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.take_back();
        // SAFETY: restores the disposition saved in `open`.
        unsafe {
            libc::sigaction(libc::SIGTTOU, &self.ttou, std::ptr::null_mut());
        }
    }
}

impl ForChild {
    /// Runs in the child between fork and exec, after it made its own process group: only
    /// async-signal-safe calls. A terminal it cannot take is not an error: the command runs
    /// as it would have without it.
    pub fn in_child(&self) {
        // SAFETY: tcsetpgrp, getpid and sigaction are async-signal-safe; SIGTTOU is still
        // ignored here (inherited), so a background group may take the terminal.
        unsafe {
            if self.take {
                libc::tcsetpgrp(self.fd, libc::getpid());
            }
            libc::sigaction(libc::SIGTTOU, &self.ttou, std::ptr::null_mut());
        }
    }
}
