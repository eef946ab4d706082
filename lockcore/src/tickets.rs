//! Wake-ups by ticket, for stores that queue waiters: a release names the first place of
//! the store's queue, and only the waiter of this process holding that place wakes — not
//! one chosen by arrival in this process (the wrong one whenever several of its waiters
//! queue for one key), and not all of them.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The tickets waited on in one process, each named by `T` (a key or channel and the
/// place's number in the store's queue, say).
///
/// A driver whose releases announce the ticket of the queue's first place registers a
/// waiter's ticket with [`wait`](Self::wait) *before* it re-checks the queue, and wakes it
/// with [`wake`](Self::wake) when the announcement arrives. An announcement that arrives
/// between the registration and the await is kept, not missed. When announcements may have
/// been lost (a broken connection), [`wake_all`](Self::wake_all) wakes everyone.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use lockcore::driver::Tickets;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let tickets: Arc<Tickets<(String, i64)>> = Arc::default();
/// let mine = tickets.wait(("jobs/report".to_owned(), 7));
/// // The release announced ticket 7 of this key before the waiter awaited: kept.
/// assert!(tickets.wake(&("jobs/report".to_owned(), 7)));
/// mine.announced().await;
/// // Nobody here waits for ticket 8.
/// assert!(!tickets.wake(&("jobs/report".to_owned(), 8)));
/// # }
/// ```
#[derive(Debug)]
pub struct Tickets<T> {
    waits: Mutex<HashMap<T, Entry>>,
}

#[derive(Debug)]
struct Entry {
    notify: Arc<Notify>,
    refs: usize,
}

impl<T> Default for Tickets<T> {
    fn default() -> Self {
        Tickets {
            waits: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Eq + Hash + Clone> Tickets<T> {
    fn waits(&self) -> MutexGuard<'_, HashMap<T, Entry>> {
        self.waits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a wait for `ticket`. Call it before re-checking the store, so that an
    /// announcement in between is kept (as a stored permit) rather than missed.
    pub fn wait(self: &Arc<Self>, ticket: T) -> TicketWait<T> {
        let notify = {
            let mut waits = self.waits();
            let entry = waits.entry(ticket.clone()).or_insert_with(|| Entry {
                notify: Arc::new(Notify::new()),
                refs: 0,
            });
            entry.refs += 1;
            entry.notify.clone()
        };
        TicketWait {
            tickets: self.clone(),
            ticket,
            notify,
        }
    }

    /// Wakes the waiter of `ticket`: whether one waits in this process.
    pub fn wake(&self, ticket: &T) -> bool {
        match self.waits().get(ticket) {
            Some(entry) => {
                entry.notify.notify_one();
                true
            }
            None => false,
        }
    }

    /// Wakes the waiter of every ticket `which` picks (a release that named no ticket: a
    /// client that does not queue, an operator's break).
    pub fn wake_where(&self, which: impl Fn(&T) -> bool) {
        for (ticket, entry) in self.waits().iter() {
            if which(ticket) {
                entry.notify.notify_one();
            }
        }
    }

    /// Wakes every waiter (announcements may have been missed: a lost connection).
    pub fn wake_all(&self) {
        self.wake_where(|_| true);
    }
}

/// A registered wait for one ticket (see [`Tickets::wait`]); dropping it gives the wait up.
#[derive(Debug)]
pub struct TicketWait<T: Eq + Hash + Clone> {
    tickets: Arc<Tickets<T>>,
    ticket: T,
    notify: Arc<Notify>,
}

impl<T: Eq + Hash + Clone> TicketWait<T> {
    /// Resolves when the ticket is announced (or was, since the registration).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an announcement not seen by a cancelled call is seen by the next.
    pub async fn announced(&self) {
        self.notify.notified().await;
    }
}

impl<T: Eq + Hash + Clone> Drop for TicketWait<T> {
    fn drop(&mut self) {
        let mut waits = self.tickets.waits();
        if let Some(entry) = waits.get_mut(&self.ticket) {
            entry.refs = entry.refs.saturating_sub(1);
            if entry.refs == 0 {
                waits.remove(&self.ticket);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn only_the_announced_ticket_wakes_and_an_early_announcement_is_kept() {
        let tickets: Arc<Tickets<(&str, i64)>> = Arc::default();
        let first = tickets.wait(("c", 1));
        let second = tickets.wait(("c", 2));
        let elsewhere = tickets.wait(("d", 1));
        // Announced before anyone awaits: kept.
        assert!(tickets.wake(&("c", 2)));
        assert!(
            !tickets.wake(&("other", 2)),
            "another channel's ticket woke a waiter"
        );
        let short = Duration::from_millis(50);
        assert!(tokio::time::timeout(short, second.announced())
            .await
            .is_ok());
        assert!(
            tokio::time::timeout(short, first.announced())
                .await
                .is_err(),
            "a ticket that was not announced woke"
        );
        drop(second);
        assert!(
            !tickets.wake(&("c", 2)),
            "a wait given up is still registered"
        );
        tickets.wake_where(|(channel, _)| *channel == "c");
        assert!(tokio::time::timeout(short, first.announced()).await.is_ok());
        assert!(
            tokio::time::timeout(short, elsewhere.announced())
                .await
                .is_err(),
            "waking one channel's tickets woke another's"
        );
        tickets.wake_all();
        assert!(tokio::time::timeout(short, elsewhere.announced())
            .await
            .is_ok());
    }
}
