//! The controlling terminal, handed to the command as a shell hands it to a foreground job.
//!
//! The command leads its own process group, so that distlock can signal it and everything
//! it started. A group that is not the terminal's foreground group is stopped (SIGTTIN,
//! SIGTTOU) when it reads the terminal or changes its settings: when distlock is itself in
//! the foreground, it makes the command's group the foreground group while the command runs,
//! and takes the terminal back when it ends or stops.

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

    /// Records that the child's process group `group` has (or was meant to get) the terminal.
    pub fn given(&mut self, child: &ForChild, group: libc::pid_t) {
        if child.take {
            self.given_to = Some(group);
        }
    }

    /// Gives the terminal to `group` if distlock's own group has it.
    pub fn give(&mut self, group: libc::pid_t) {
        if self.is_foreground() {
            // SAFETY: tcsetpgrp on an open fd; SIGTTOU is ignored.
            if unsafe { libc::tcsetpgrp(self.tty.as_raw_fd(), group) } == 0 {
                self.given_to = Some(group);
            }
        }
    }

    /// Whether the terminal was given away and not taken back.
    pub fn is_given(&self) -> bool {
        self.given_to.is_some()
    }

    /// Takes the terminal back for distlock's group if it gave it away.
    pub fn take_back(&mut self) {
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
