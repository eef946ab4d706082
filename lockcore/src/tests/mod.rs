//! lockcore's own tests of the client, guards and watchdog, through the public API (and
//! the few test hooks the client has).

mod claims;
mod client;
mod election;
pub(crate) mod faulty;
mod first_contact;
mod guard;
#[cfg(feature = "metrics")]
mod metrics;
mod multi;
mod renewal_batches;
mod reservations;
mod starving;
mod testing;
mod watchdog;
