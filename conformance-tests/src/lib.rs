//! The distlock conformance suite: the same named scenarios, run against every backend.
//!
//! A backend proves it keeps the lock contract by passing every scenario of
//! [`scenarios`]: mutual exclusion, expiry, misrelease, fencing, waiting, cancellation,
//! bad input, faults. A driver opts in with a [`Harness`] and one macro call, which expands
//! to one `#[test]` per scenario, named after it:
//!
//! ```ignore
//! conformance_tests::suite!(
//!     conformance,                          // module of the generated tests
//!     capabilities: my_driver::CAPABILITIES, // checked at compile time against the flags below
//!     notifications: true,                  // the backend wakes waiters on release
//!     faults: true,                         // the harness implements the fault hooks
//!     harness: || async { MyHarness::start().await },
//! );
//! ```
//!
//! A scenario the backend cannot run is emitted as `#[ignore = "needs …"]`: visible in the
//! test list, never silently green. See `docs/writing-a-driver.md`.
//!
//! The suite can fail: [`broken`] holds deliberately broken backends, and the suite's own
//! tests show which scenarios catch each one.

pub mod broken;
pub mod harness;
pub mod layer;
pub mod process;
pub mod proxy;
pub mod scenarios;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use harness::{FaultClient, FaultLink, FaultStore, Harness};
pub use layer::FaultLayer;
pub use proxy::TcpProxy;

/// A scenario found the contract broken.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(format!("unexpected error: {e}"))
    }
}

/// What every scenario returns.
pub type Outcome = Result<(), Failure>;

/// Fails the scenario with a message unless the condition holds.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}

/// A running scenario.
pub type ScenarioFuture = std::pin::Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A scenario of the catalogue, for running it by name (the self-test does).
pub struct Scenario {
    /// The scenario's name (its function's name).
    pub name: &'static str,
    /// Whether it needs fault hooks.
    pub needs_faults: bool,
    /// Runs it.
    pub run: fn(Arc<dyn Harness>) -> ScenarioFuture,
}

/// Every scenario of the catalogue, in order.
pub fn catalogue() -> Vec<Scenario> {
    let mut all = Vec::with_capacity(32);
    __scenarios!(crate::__catalogue_entry, all, _, _);
    all
}

#[doc(hidden)]
#[macro_export]
macro_rules! __catalogue_entry {
    ($name:ident, $needs:ident, $all:expr, $n:tt, $f:tt) => {
        $all.push($crate::Scenario {
            name: stringify!($name),
            needs_faults: stringify!($needs) == "faults",
            run: |h| Box::pin($crate::scenarios::$name(h)),
        });
    };
}

/// The longest any one scenario may run before it counts as failed (hung).
pub fn scenario_limit(ttl: Duration) -> Duration {
    Duration::from_secs(60) + ttl * 30
}

/// Runs one scenario against a harness from `factory`, on a multi-thread runtime, within
/// [`scenario_limit`]. Panics (fails the test) on failure. Used by [`suite!`].
pub fn run<F, FFut, H, S, SFut>(
    name: &str,
    factory: F,
    scenario: S,
    notifications: bool,
    faults: bool,
) where
    F: FnOnce() -> FFut,
    FFut: Future<Output = H>,
    H: Harness,
    S: FnOnce(Arc<dyn Harness>) -> SFut,
    SFut: Future<Output = Outcome>,
{
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("{name}: cannot build a tokio runtime: {e}"),
    };
    let result = rt.block_on(async move {
        let harness: Arc<dyn Harness> = Arc::new(factory().await);
        let limit = scenario_limit(harness.ttl());
        check_declared(&*harness, notifications, faults).await?;
        match tokio::time::timeout(limit, scenario(harness)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure(format!("did not finish within {limit:?}"))),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    if let Err(failure) = result {
        panic!("scenario {name} failed: {failure}");
    }
}

/// The flags given to [`suite!`] must match what the harness and backend really do, or a
/// scenario could be skipped without reason.
async fn check_declared(h: &dyn Harness, notifications: bool, faults: bool) -> Outcome {
    let caps = h.client().await?.capabilities();
    check!(
        caps.notifications == notifications,
        "suite! says notifications: {notifications}, the backend declares {}",
        caps.notifications
    );
    if faults {
        check!(
            h.fault_store().await?.is_some(),
            "suite! says faults: true, but the harness has no fault store"
        );
    }
    Ok(())
}

/// Expands to one `#[test]` per scenario of the catalogue; see the [crate docs](crate).
///
/// `in_tree` before the module name demands `faults: true`: an in-tree backend may skip
/// only what its capabilities justify, and this makes a harness without fault hooks a
/// build error.
#[macro_export]
macro_rules! suite {
    (in_tree $module:ident, capabilities: $caps:expr, notifications: $n:tt, faults: true, harness: $factory:expr $(,)?) => {
        $crate::suite!($module, capabilities: $caps, notifications: $n, faults: true, harness: $factory);
    };
    (in_tree $module:ident, capabilities: $caps:expr, notifications: $n:tt, faults: false, harness: $factory:expr $(,)?) => {
        compile_error!("an in-tree backend must implement every fault hook (faults: true)");
    };
    ($module:ident, capabilities: $caps:expr, notifications: $n:tt, faults: $f:tt, harness: $factory:expr $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            const _: () = assert!(
                $caps.notifications == $n,
                "suite!: the `notifications` flag must match the backend's declared capabilities"
            );
            $crate::__scenarios!($crate::__scenario_test, $factory, $n, $f);
        }
    };
}

/// The catalogue: every scenario with what it needs. Used by [`suite!`] and the self-test.
#[doc(hidden)]
#[macro_export]
macro_rules! __scenarios {
    ($each:path, $factory:expr, $n:tt, $f:tt) => {
        $each!(mutual_exclusion, always, $factory, $n, $f);
        $each!(try_acquire_reports_holder, always, $factory, $n, $f);
        $each!(expiry_frees_lock, always, $factory, $n, $f);
        $each!(release_by_stranger_is_not_held, always, $factory, $n, $f);
        $each!(late_release_keeps_new_holder, always, $factory, $n, $f);
        $each!(extend_keeps_and_fails_after_loss, always, $factory, $n, $f);
        $each!(fencing_tokens_increase, always, $factory, $n, $f);
        $each!(stale_token_rejected, always, $factory, $n, $f);
        $each!(paused_holder_write_rejected, faults, $factory, $n, $f);
        $each!(reentrant_counts, always, $factory, $n, $f);
        $each!(waiter_acquires_after_release, always, $factory, $n, $f);
        $each!(contended_handoff_keeps_waking, always, $factory, $n, $f);
        $each!(wait_deadline_times_out, always, $factory, $n, $f);
        $each!(cancelled_acquire_leaves_nothing, faults, $factory, $n, $f);
        $each!(watchdog_keeps_lock, always, $factory, $n, $f);
        $each!(lost_fires_when_renewal_impossible, faults, $factory, $n, $f);
        $each!(dropped_guard_released, always, $factory, $n, $f);
        $each!(independent_keys, always, $factory, $n, $f);
        $each!(bad_input_rejected, always, $factory, $n, $f);
        $each!(hostile_keys_isolated, always, $factory, $n, $f);
        $each!(inspect_hides_owner_token, always, $factory, $n, $f);
        $each!(store_unavailable, faults, $factory, $n, $f);
        $each!(many_keys, always, $factory, $n, $f);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_test {
    ($name:ident, always, $factory:expr, $n:tt, $f:tt) => {
        $crate::__emit_test!($name, $factory, $n, $f);
    };
    ($name:ident, faults, $factory:expr, $n:tt, true) => {
        $crate::__emit_test!($name, $factory, $n, true);
    };
    ($name:ident, faults, $factory:expr, $n:tt, false) => {
        #[test]
        #[ignore = "needs fault hooks (faults: true)"]
        fn $name() {
            panic!("this backend declares no fault hooks");
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_test {
    ($name:ident, $factory:expr, $n:tt, $f:tt) => {
        #[doc = concat!("Conformance scenario `", stringify!($name), "`.")]
        #[test]
        fn $name() {
            $crate::run(
                stringify!($name),
                $factory,
                $crate::scenarios::$name,
                $n,
                $f,
            );
        }
    };
}
