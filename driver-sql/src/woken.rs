//! What a waiter's wait ends on: a release of its key, or the announcement of its place
//! in a fair store's queue.

use lockcore::driver::{Subscription, TicketWait};
use lockcore::LockKey;

/// What wakes a wait: a release of its key, or the announcement of its ticket (a fair
/// store's waiter that knows its place).
pub(crate) enum Woken {
    Release(Subscription),
    Ticket(TicketWait<(LockKey, i64)>),
}

impl Woken {
    pub(crate) async fn woken(self) {
        match self {
            Woken::Release(subscription) => subscription.released().await,
            Woken::Ticket(ticket) => ticket.announced().await,
        }
    }
}
