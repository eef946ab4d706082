//! Wake-ups by ticket, for the fair layout: a release publishes the ticket of the first
//! waiter in the store's queue, and only the waiter of this process holding that ticket
//! wakes, not one chosen by arrival in this process (which would be the wrong one whenever
//! several of its waiters queue for one key) and not all of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The tickets waited on in this process, per release channel.
#[derive(Debug, Default)]
pub(crate) struct Tickets {
    waits: Mutex<HashMap<(String, i64), Entry>>,
}

#[derive(Debug)]
struct Entry {
    notify: Arc<Notify>,
    refs: usize,
}

impl Tickets {
    fn waits(&self) -> MutexGuard<'_, HashMap<(String, i64), Entry>> {
        self.waits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a wait for `ticket` on `channel`; call before re-checking the queue, so
    /// an announcement in between is kept (as a stored permit) rather than missed.
    pub(crate) fn wait(self: &Arc<Self>, channel: &str, ticket: i64) -> TicketWait {
        let key = (channel.to_owned(), ticket);
        let notify = {
            let mut waits = self.waits();
            let entry = waits.entry(key.clone()).or_insert_with(|| Entry {
                notify: Arc::new(Notify::new()),
                refs: 0,
            });
            entry.refs += 1;
            entry.notify.clone()
        };
        TicketWait {
            tickets: self.clone(),
            key,
            notify,
        }
    }

    /// Wakes the waiter of `ticket` on `channel`: whether one waits in this process.
    pub(crate) fn wake(&self, channel: &str, ticket: i64) -> bool {
        // Looked up by a borrowed pair would need a second map level; a channel name is short.
        match self.waits().get(&(channel.to_owned(), ticket)) {
            Some(entry) => {
                entry.notify.notify_one();
                true
            }
            None => false,
        }
    }

    /// Wakes every waiter (announcements may have been missed: a lost connection).
    pub(crate) fn wake_all(&self) {
        for entry in self.waits().values() {
            entry.notify.notify_one();
        }
    }
}

/// A registered wait for one ticket; dropping it gives the wait up.
#[derive(Debug)]
pub(crate) struct TicketWait {
    tickets: Arc<Tickets>,
    key: (String, i64),
    notify: Arc<Notify>,
}

impl TicketWait {
    /// Resolves when the ticket is announced (or was, since the registration).
    pub(crate) async fn announced(&self) {
        self.notify.notified().await;
    }
}

impl Drop for TicketWait {
    fn drop(&mut self) {
        let mut waits = self.tickets.waits();
        if let Some(entry) = waits.get_mut(&self.key) {
            entry.refs = entry.refs.saturating_sub(1);
            if entry.refs == 0 {
                waits.remove(&self.key);
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
        let tickets = Arc::new(Tickets::default());
        let first = tickets.wait("c", 1);
        let second = tickets.wait("c", 2);
        // Announced before anyone awaits: kept.
        assert!(tickets.wake("c", 2));
        assert!(
            !tickets.wake("other", 2),
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
        assert!(!tickets.wake("c", 2), "a wait given up is still registered");
        tickets.wake_all();
        assert!(tokio::time::timeout(short, first.announced()).await.is_ok());
    }
}
