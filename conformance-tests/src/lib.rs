//! The distlock conformance suite: the same named scenarios, run against every backend.
//!
//! A backend proves it keeps the lock contract by passing every scenario of
//! [`scenarios`]: mutual exclusion, expiry, misrelease, fencing, waiting, cancellation,
//! bad input, faults, and — for a backend that declares them — read-write locks and
//! semaphores. A driver opts in with a [`Harness`] and one macro call, which expands
//! to one `#[test]` per scenario, named after it:
//!
//! ```ignore
//! distlock_conformance::suite!(
//!     conformance,                          // module of the generated tests
//!     capabilities: my_driver::CAPABILITIES, // checked at compile time against the flags below
//!     faults: true,                         // the harness implements the fault hooks
//!     shared: true,                         // optional (default false): read-write locks
//!     semaphores: true,                     // optional (default false): semaphores
//!     fencing: true,                        // optional (default true): fencing tokens
//!     harness: || async { MyHarness::start().await },
//! );
//! ```
//!
//! A scenario the backend cannot run is emitted as `#[ignore = "needs …"]`: visible in the
//! test list, never silently green. `shared` and `semaphores` must equal the backend's
//! [`Capabilities::shared`](lockcore::driver::Capabilities::shared) and
//! [`Capabilities::semaphores`](lockcore::driver::Capabilities::semaphores) (checked at compile
//! time), so a backend that declares shared claims cannot leave their scenarios out. See
//! `docs/writing-a-driver.md`.
//!
//! The suite can fail: [`broken`] holds deliberately broken backends, and the suite's own
//! tests show which scenarios catch each one.

pub mod broken;
pub mod harness;
pub mod history;
pub mod layer;
pub mod networked;
pub mod process;
pub mod proxy;
pub mod scenarios;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use harness::{FaultClient, FaultLink, FaultStore, Harness, Restart, Tamper};
pub use layer::FaultLayer;
#[doc(hidden)]
pub use lockcore as __lockcore;
use lockcore::driver::FencingGuarantee;
pub use networked::NetworkedStore;
pub use proxy::TcpProxy;

/// A scenario found the contract broken.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error + 'static> From<E> for Failure {
    /// The error with its sources (`postgres is unavailable: …: connection refused`), so a
    /// failure says what went wrong underneath.
    fn from(e: E) -> Self {
        Failure(format!("unexpected error: {}", lockcore::ErrorChain(&e)))
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
    /// Whether it needs shared claims ([`Capabilities::shared`](lockcore::driver::Capabilities::shared)).
    pub needs_shared: bool,
    /// Whether it needs semaphores
    /// ([`Capabilities::semaphores`](lockcore::driver::Capabilities::semaphores)).
    pub needs_semaphores: bool,
    /// Whether it needs fencing tokens (a backend whose
    /// [`Capabilities::fencing`](lockcore::driver::Capabilities::fencing) is not `None`).
    pub needs_fencing: bool,
    /// Whether it needs FIFO fairness (a backend whose
    /// [`Capabilities::fairness`](lockcore::driver::Capabilities::fairness) is `Fifo`).
    pub needs_fifo: bool,
    /// Whether it needs waiters served within a bound (a backend whose
    /// [`Capabilities::fairness`](lockcore::driver::Capabilities::fairness) is `Bounded` or `Fifo`).
    pub needs_bounded: bool,
    /// Whether it needs marks for long waits (a backend whose
    /// [`Capabilities::fairness`](lockcore::driver::Capabilities::fairness) is `Bounded`).
    pub needs_marks: bool,
    /// Runs it.
    pub run: fn(Arc<dyn Harness>) -> ScenarioFuture,
}

/// Every scenario of the catalogue, in order.
pub fn catalogue() -> Vec<Scenario> {
    let mut all = Vec::with_capacity(80);
    __scenarios!(crate::__catalogue_entry, all, _, _, _, _, _);
    all.push(Scenario {
        name: "fifo_across_clients",
        needs_faults: false,
        needs_shared: false,
        needs_semaphores: false,
        needs_fencing: false,
        needs_fifo: true,
        needs_bounded: true,
        needs_marks: false,
        run: |h| Box::pin(scenarios::fifo_across_clients(h)),
    });
    all.push(Scenario {
        name: "releasing_client_does_not_starve_waiter",
        needs_faults: false,
        needs_shared: false,
        needs_semaphores: false,
        needs_fencing: false,
        needs_fifo: false,
        needs_bounded: true,
        needs_marks: false,
        run: |h| Box::pin(scenarios::releasing_client_does_not_starve_waiter(h)),
    });
    all.push(Scenario {
        name: "long_wait_marks_next_turn",
        needs_faults: false,
        needs_shared: false,
        needs_semaphores: false,
        needs_fencing: false,
        needs_fifo: false,
        needs_bounded: true,
        needs_marks: true,
        run: |h| Box::pin(scenarios::long_wait_marks_next_turn(h)),
    });
    all
}

#[doc(hidden)]
#[macro_export]
macro_rules! __catalogue_entry {
    ($name:ident, $needs:ident, $all:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $all.push($crate::Scenario {
            name: stringify!($name),
            needs_faults: matches!(
                stringify!($needs),
                "faults" | "shared_faults" | "fencing_faults"
            ),
            needs_shared: matches!(stringify!($needs), "shared" | "shared_faults"),
            needs_semaphores: stringify!($needs) == "semaphores",
            needs_fencing: matches!(stringify!($needs), "fencing" | "fencing_faults"),
            needs_fifo: false,
            needs_bounded: false,
            needs_marks: false,
            run: |h| Box::pin($crate::scenarios::$name(h)),
        });
    };
}

/// The longest any one scenario may run before it counts as failed (hung).
pub fn scenario_limit(ttl: Duration) -> Duration {
    Duration::from_secs(60) + ttl * 30
}

/// What a [`suite!`] call declares of its backend and harness, checked before every
/// scenario runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Declared {
    /// The `notifications` flag.
    pub notifications: bool,
    /// The `faults` flag.
    pub faults: bool,
    /// The `shared` flag (default `false`).
    pub shared: bool,
    /// The `semaphores` flag (default `false`).
    pub semaphores: bool,
    /// The `fencing` flag (default `true`): whether the backend hands out fencing tokens.
    pub fencing: bool,
}

/// Runs one scenario against a harness from `factory`, on a multi-thread runtime, within
/// [`scenario_limit`], after checking the `notifications` and `faults` flags. Panics (fails
/// the test) on failure. For a hand-picked list of scenarios; [`suite!`] uses
/// [`run_declared`], which checks the shared-claim flags too.
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
    let declared = Declared {
        notifications,
        faults,
        ..Declared::default()
    };
    run_checked(name, factory, scenario, declared, false);
}

/// Runs one scenario as [`run`] does, after checking every flag of `declared` against the
/// harness and backend. Used by [`suite!`].
pub fn run_declared<F, FFut, H, S, SFut>(name: &str, factory: F, scenario: S, declared: Declared)
where
    F: FnOnce() -> FFut,
    FFut: Future<Output = H>,
    H: Harness,
    S: FnOnce(Arc<dyn Harness>) -> SFut,
    SFut: Future<Output = Outcome>,
{
    run_checked(name, factory, scenario, declared, true);
}

fn run_checked<F, FFut, H, S, SFut>(
    name: &str,
    factory: F,
    scenario: S,
    declared: Declared,
    claims_declared: bool,
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
        check_declared(&*harness, declared, claims_declared).await?;
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
/// scenario could be skipped without reason. `claims`: whether the shared-claim flags were
/// given (a plain [`run`] has none).
async fn check_declared(h: &dyn Harness, declared: Declared, claims: bool) -> Outcome {
    let caps = h.client().await?.capabilities();
    let Declared {
        notifications,
        faults,
        shared,
        semaphores,
        fencing,
    } = declared;
    check!(
        caps.notifications == notifications,
        "suite! says notifications: {notifications}, the backend declares {}",
        caps.notifications
    );
    check!(
        !claims || caps.shared == shared,
        "suite! says shared: {shared}, the backend declares {}",
        caps.shared
    );
    check!(
        !claims || caps.semaphores == semaphores,
        "suite! says semaphores: {semaphores}, the backend declares {}",
        caps.semaphores
    );
    check!(
        !claims || (caps.fencing != FencingGuarantee::None) == fencing,
        "suite! says fencing: {fencing}, the backend declares {:?}",
        caps.fencing
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
/// `extra: [my_scenario, …]` (optional, just before `harness`) adds the driver's own
/// scenarios to the module: each an `async fn(Arc<dyn Harness>) -> Outcome` in scope where
/// `suite!` is called, run like the catalogue's (same harness, runtime, time limit and flag
/// checks), and written with [`check!`] like them.
///
/// Whether the backend wakes waiters on release comes from the capabilities
/// ([`Capabilities::notifications`](lockcore::driver::Capabilities::notifications)); a
/// `notifications: …` flag before `faults`, as calls written before it was derived have,
/// is still accepted and must equal it.
///
/// `shared: …` and `semaphores: …` are optional (in that order, after `faults`) and default
/// to `false`, so a call written before shared claims existed compiles unchanged; each must
/// equal the backend's declared capability. `fencing: …` (optional, after them, default
/// `true`) says whether the backend hands out fencing tokens: a backend declaring
/// [`FencingGuarantee::None`] says `fencing: false`, and the scenarios about tokens are
/// emitted as ignored with that reason (the others skip their token checks). `fair: …`
/// (optional, after `fencing`, default `false`) must say what the backend declares:
/// `true` for [`Fairness::Fifo`](lockcore::driver::Fairness::Fifo), `bounded` for
/// [`Fairness::Bounded`](lockcore::driver::Fairness::Bounded), `false` for
/// [`Fairness::None`](lockcore::driver::Fairness::None). The scenarios about arrival order across
/// clients run only with `true`; the bound on starvation runs with `true` or `bounded`.
///
/// `in_tree` before the module name demands `faults: true`: an in-tree backend may skip
/// only what its capabilities justify, and this makes a harness without fault hooks a
/// build error.
#[macro_export]
macro_rules! suite {
    (in_tree $module:ident, capabilities: $caps:expr, $(notifications: $n:tt,)? faults: true,
     $(shared: $s:tt,)? $(semaphores: $m:tt,)? $(fencing: $fe:tt,)? $(fair: $fi:tt,)?
     $(extra: [$($x:ident),* $(,)?],)? harness: $factory:expr $(,)?) => {
        $crate::suite!($module, capabilities: $caps, $(notifications: $n,)? faults: true,
            $(shared: $s,)? $(semaphores: $m,)? $(fencing: $fe,)? $(fair: $fi,)?
            $(extra: [$($x),*],)? harness: $factory);
    };
    (in_tree $module:ident, capabilities: $caps:expr, $(notifications: $n:tt,)? faults: false,
     $(shared: $s:tt,)? $(semaphores: $m:tt,)? $(fencing: $fe:tt,)? $(fair: $fi:tt,)?
     $(extra: [$($x:ident),* $(,)?],)? harness: $factory:expr $(,)?) => {
        compile_error!("an in-tree backend must implement every fault hook (faults: true)");
    };
    ($module:ident, capabilities: $caps:expr, $(notifications: $n:tt,)? faults: $f:tt,
     $(shared: $s:tt,)? $(semaphores: $m:tt,)? $(fencing: $fe:tt,)? $(fair: $fi:tt,)?
     $(extra: [$($x:ident),* $(,)?],)? harness: $factory:expr $(,)?) => {
        $crate::__suite_module!($module, $caps, [$($n)?], $f, [$($s)?], [$($m)?], [$($fe)?],
            [$($fi)?], [$($($x),*)?], $factory);
    };
}

/// [`suite!`] with its optional flags filled in (absent = `false`).
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_module {
    ($module:ident, $caps:expr, [], $f:tt, $s:tt, $m:tt, $fe:tt, $fi:tt, $x:tt, $factory:expr) => {
        $crate::__suite_module!($module, $caps, [($caps.notifications)], $f, $s, $m, $fe, $fi, $x, $factory);
    };
    ($module:ident, $caps:expr, [$n:tt], $f:tt, [], $m:tt, $fe:tt, $fi:tt, $x:tt, $factory:expr) => {
        $crate::__suite_module!($module, $caps, [$n], $f, [false], $m, $fe, $fi, $x, $factory);
    };
    ($module:ident, $caps:expr, [$n:tt], $f:tt, [$s:tt], [], $fe:tt, $fi:tt, $x:tt, $factory:expr) => {
        $crate::__suite_module!($module, $caps, [$n], $f, [$s], [false], $fe, $fi, $x, $factory);
    };
    ($module:ident, $caps:expr, [$n:tt], $f:tt, [$s:tt], [$m:tt], [], $fi:tt, $x:tt, $factory:expr) => {
        $crate::__suite_module!($module, $caps, [$n], $f, [$s], [$m], [true], $fi, $x, $factory);
    };
    ($module:ident, $caps:expr, [$n:tt], $f:tt, [$s:tt], [$m:tt], [$fe:tt], [], $x:tt, $factory:expr) => {
        $crate::__suite_module!($module, $caps, [$n], $f, [$s], [$m], [$fe], [false], $x, $factory);
    };
    ($module:ident, $caps:expr, [$n:tt], $f:tt, [$s:tt], [$m:tt], [$fe:tt], [$fi:tt], [$($x:ident),*],
     $factory:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            const _: () = assert!(
                $caps.notifications == $n,
                "suite!: the `notifications` flag must match the backend's declared capabilities"
            );
            const _: () = assert!(
                $caps.shared == $s,
                "suite!: the `shared` flag must match the backend's declared capabilities (Capabilities::shared)"
            );
            const _: () = assert!(
                $caps.semaphores == $m,
                "suite!: the `semaphores` flag must match the backend's declared capabilities (Capabilities::semaphores)"
            );
            const _: () = assert!(
                !matches!($caps.fencing, $crate::__lockcore::driver::FencingGuarantee::None) == $fe,
                "suite!: the `fencing` flag must say whether the backend declares fencing tokens (Capabilities::fencing is not None)"
            );
            const _: () = assert!(
                $crate::__fairness_declared!($caps, $fi),
                "suite!: the `fair` flag must say what fairness the backend declares (true: Fifo, bounded: Bounded, false: None)"
            );
            $crate::__scenarios!($crate::__scenario_test, $factory, $n, $f, $s, $m, $fe);
            $crate::__fifo_scenario_test!(fifo_across_clients, $fi, $factory, $n, $f, $s, $m, $fe);
            $crate::__bounded_scenario_test!(
                releasing_client_does_not_starve_waiter, $fi, $factory, $n, $f, $s, $m, $fe
            );
            $crate::__marks_scenario_test!(
                long_wait_marks_next_turn, $fi, $factory, $n, $f, $s, $m, $fe
            );
            $(
                #[doc = concat!("The driver's own scenario `", stringify!($x), "`.")]
                #[test]
                fn $x() {
                    $crate::run_declared(
                        stringify!($x),
                        $factory,
                        super::$x,
                        $crate::Declared {
                            notifications: $n,
                            faults: $f,
                            shared: $s,
                            semaphores: $m,
                            fencing: $fe,
                        },
                    );
                }
            )*
        }
    };
}

/// The scenarios that need FIFO fairness (`fair: true`), emitted or listed as ignored.
#[doc(hidden)]
#[macro_export]
macro_rules! __fifo_scenario_test {
    ($name:ident, true, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, $f, $s, $m, $fe);
    };
    ($name:ident, $other:tt, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $crate::__ignored_test!(
            $name,
            "needs FIFO fairness (Capabilities::fairness is Fifo)"
        );
    };
}

/// The scenarios that need waiters served within a bound (`fair: true` or `fair: bounded`),
/// emitted or listed as ignored.
#[doc(hidden)]
#[macro_export]
macro_rules! __bounded_scenario_test {
    ($name:ident, false, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $crate::__ignored_test!(
            $name,
            "needs waiters served within a bound (Capabilities::fairness is Bounded or Fifo)"
        );
    };
    ($name:ident, $other:tt, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, $f, $s, $m, $fe);
    };
}

/// The scenarios of marks for long waits (`fair: bounded`), emitted or listed as ignored.
#[doc(hidden)]
#[macro_export]
macro_rules! __marks_scenario_test {
    ($name:ident, bounded, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, $f, $s, $m, $fe);
    };
    ($name:ident, $other:tt, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $crate::__ignored_test!(
            $name,
            "needs marks for long waits (Capabilities::fairness is Bounded)"
        );
    };
}

/// Whether the `fair` flag of [`suite!`] says what `caps` declare.
#[doc(hidden)]
#[macro_export]
macro_rules! __fairness_declared {
    ($caps:expr, true) => {
        matches!($caps.fairness, $crate::__lockcore::driver::Fairness::Fifo)
    };
    ($caps:expr, bounded) => {
        matches!(
            $caps.fairness,
            $crate::__lockcore::driver::Fairness::Bounded
        )
    };
    ($caps:expr, false) => {
        matches!($caps.fairness, $crate::__lockcore::driver::Fairness::None)
    };
}

/// The catalogue: every scenario with what it needs (`always`, `faults`, `shared`,
/// `shared_faults`, `semaphores`, `fencing`, `fencing_faults`). Used by [`suite!`] and the self-test.
#[doc(hidden)]
#[macro_export]
macro_rules! __scenarios {
    ($each:path, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $each!(mutual_exclusion, always, $factory, $n, $f, $s, $m, $fe);
        $each!(
            try_acquire_reports_holder,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(expiry_frees_lock, always, $factory, $n, $f, $s, $m, $fe);
        $each!(
            release_by_stranger_is_not_held,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            late_release_keeps_new_holder,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            extend_keeps_and_fails_after_loss,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            extend_never_shortens_lease,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            fencing_tokens_increase,
            fencing,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            held_lock_survives_restart_keeping_data,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            takeover_not_before_store_expiry,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            deleted_record_seen_as_lost,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            reassigned_record_seen_as_lost,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            rewritten_record_changes_nothing,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            tokens_increase_across_restart_same_key,
            fencing_faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(stale_token_rejected, fencing, $factory, $n, $f, $s, $m, $fe);
        $each!(
            paused_holder_write_rejected,
            fencing_faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            slow_acquire_token_above_meanwhile,
            fencing_faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(reentrant_counts, always, $factory, $n, $f, $s, $m, $fe);
        $each!(
            waiter_acquires_after_release,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            contended_handoff_keeps_waking,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            wait_deadline_times_out,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            short_deadline_fresh_keys_granted,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            short_deadline_answers_first_attempt,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            cancelled_acquire_leaves_nothing,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            cancelled_key_set_leaves_nothing,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            valid_until_within_store_expiry,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(watchdog_keeps_lock, always, $factory, $n, $f, $s, $m, $fe);
        $each!(
            lost_fires_when_renewal_impossible,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            hold_survives_slow_reconnect,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            no_renewal_after_release,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            full_renewal_batch_answers_each,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            batched_renewal_keeps_each_hold,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            unrenewed_hold_expires_beside_renewed,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            dropped_guard_released,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(independent_keys, always, $factory, $n, $f, $s, $m, $fe);
        $each!(
            key_sets_all_or_nothing,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            key_sets_in_opposite_orders_finish,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(key_set_tokens_rise, fencing, $factory, $n, $f, $s, $m, $fe);
        $each!(
            dropped_key_set_leaves_nothing,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            key_set_lost_when_one_key_lost,
            faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(bad_input_rejected, always, $factory, $n, $f, $s, $m, $fe);
        $each!(hostile_keys_isolated, always, $factory, $n, $f, $s, $m, $fe);
        $each!(
            inspect_hides_owner_token,
            always,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(store_unavailable, faults, $factory, $n, $f, $s, $m, $fe);
        $each!(many_keys, always, $factory, $n, $f, $s, $m, $fe);
        $each!(
            election_one_leader_at_a_time,
            fencing,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            deposed_leader_term_rejected,
            fencing_faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            observers_see_every_leader,
            fencing,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            resign_hands_over_promptly,
            fencing,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(readers_share, shared, $factory, $n, $f, $s, $m, $fe);
        $each!(
            mixed_renewal_batch_answers_each,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            writer_excludes_readers,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            readers_exclude_writer,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            writer_not_starved_by_readers,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            shared_reentry_keeps_mode,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            tokens_increase_across_modes,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            release_wakes_enough_waiters,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            cancelled_shared_claim_leaves_nothing,
            shared_faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            paused_reader_does_not_block_writer,
            shared_faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            paused_writer_cannot_write_under_reader,
            shared_faults,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            lapsed_lease_not_renewed,
            shared,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            semaphore_never_exceeds_capacity,
            semaphores,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            dead_holder_permits_return,
            semaphores,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
        $each!(
            capacity_mismatch_refused,
            semaphores,
            $factory,
            $n,
            $f,
            $s,
            $m,
            $fe
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_test {
    ($name:ident, always, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, $f, $s, $m, $fe);
    };
    ($name:ident, faults, $factory:expr, $n:tt, true, $s:tt, $m:tt, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, true, $s, $m, $fe);
    };
    ($name:ident, shared, $factory:expr, $n:tt, $f:tt, true, $m:tt, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, $f, true, $m, $fe);
    };
    ($name:ident, shared_faults, $factory:expr, $n:tt, true, true, $m:tt, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, true, true, $m, $fe);
    };
    ($name:ident, semaphores, $factory:expr, $n:tt, $f:tt, $s:tt, true, $fe:tt) => {
        $crate::__emit_test!($name, $factory, $n, $f, $s, true, $fe);
    };
    ($name:ident, fencing, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, true) => {
        $crate::__emit_test!($name, $factory, $n, $f, $s, $m, true);
    };
    ($name:ident, fencing_faults, $factory:expr, $n:tt, true, $s:tt, $m:tt, true) => {
        $crate::__emit_test!($name, $factory, $n, true, $s, $m, true);
    };
    ($name:ident, shared, $factory:expr, $n:tt, $f:tt, false, $m:tt, $fe:tt) => {
        $crate::__ignored_test!($name, "needs shared claims (Capabilities::shared)");
    };
    ($name:ident, shared_faults, $factory:expr, $n:tt, $f:tt, false, $m:tt, $fe:tt) => {
        $crate::__ignored_test!($name, "needs shared claims (Capabilities::shared)");
    };
    ($name:ident, semaphores, $factory:expr, $n:tt, $f:tt, $s:tt, false, $fe:tt) => {
        $crate::__ignored_test!($name, "needs semaphores (Capabilities::semaphores)");
    };
    ($name:ident, fencing, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, false) => {
        $crate::__ignored_test!(
            $name,
            "needs fencing tokens (the backend declares FencingGuarantee::None)"
        );
    };
    ($name:ident, fencing_faults, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, false) => {
        $crate::__ignored_test!(
            $name,
            "needs fencing tokens (the backend declares FencingGuarantee::None)"
        );
    };
    ($name:ident, $needs:ident, $factory:expr, $n:tt, false, $s:tt, $m:tt, $fe:tt) => {
        $crate::__ignored_test!($name, "needs fault hooks (faults: true)");
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __ignored_test {
    ($name:ident, $reason:literal) => {
        #[test]
        #[ignore = $reason]
        fn $name() {
            panic!(concat!("this backend cannot run this scenario: ", $reason));
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_test {
    ($name:ident, $factory:expr, $n:tt, $f:tt, $s:tt, $m:tt, $fe:tt) => {
        #[doc = concat!("Conformance scenario `", stringify!($name), "`.")]
        #[test]
        fn $name() {
            $crate::run_declared(
                stringify!($name),
                $factory,
                $crate::scenarios::$name,
                $crate::Declared {
                    notifications: $n,
                    faults: $f,
                    shared: $s,
                    semaphores: $m,
                    fencing: $fe,
                },
            );
        }
    };
}
