//! What a client reports about its locks, through the [`metrics`](https://docs.rs/metrics)
//! facade (Cargo feature `metrics`): plug in the exporter you already use (Prometheus,
//! StatsD, OpenTelemetry) by installing its recorder; distlock records into whatever recorder
//! is installed when an event happens, so the order of set-up does not matter.
//!
//! Every metric carries the label `backend` (the backend's
//! [`name`](crate::LockBackend::name): `redis`, `postgres`, …). The lock key is a label only
#![cfg_attr(
    feature = "metrics",
    doc = "when [`LockClientBuilder::metrics_by_key`](crate::LockClientBuilder::metrics_by_key)"
)]
#![cfg_attr(
    not(feature = "metrics"),
    doc = "when `LockClientBuilder::metrics_by_key`"
)]
//! asks for it: keys are unbounded, and every distinct key is a new time series in the
//! exporter.
//!
//! | metric | kind | labels | what it measures |
//! |---|---|---|---|
//! | `distlock_acquire_wait_seconds` | histogram | `outcome` | from the call to `acquire`/`try_acquire` to its answer: `acquired`, `contended` (a `try_acquire` that found the lock held), `timeout`, `error`, `cancelled` (the future was dropped) |
//! | `distlock_acquire_attempt_seconds` | histogram | `outcome` | one store round trip of an acquisition: `acquired`, `held`, `error` |
//! | `distlock_contention_total` | counter | | attempts the store answered "held by another owner" |
//! | `distlock_acquisitions_total` | counter | `mode` | holds granted by the store (`exclusive`, `shared`, `semaphore`); re-entries are not counted |
//! | `distlock_hold_seconds` | histogram | | from a grant to the store's answer to its release |
//! | `distlock_holds` | gauge | | holds this process has in the store now |
//! | `distlock_renewals_total` | counter | `outcome` | watchdog renewals: `extended`, `failed` (an error or no answer in time; retried), `not_held` (the lock was gone) |
//! | `distlock_locks_lost_total` | counter | | holds whose [`lost`](crate::LockHandle::lost) signal fired |
//! | `distlock_background_releases` | gauge | | releases running in the background (dropped guards, clean-up of cancelled acquisitions) not yet answered |
//! | `distlock_store_errors_total` | counter | `operation`, `kind` | failed store calls, retried ones included: `operation` is `acquire`, `release`, `extend`, `renew`, `inspect` or `force_release`; `kind` is `unavailable`, `quorum_not_reached` or `backend` |
//!
//! Without the feature, recording compiles to nothing.
//!
//! # Examples
//!
//! With `metrics-exporter-prometheus` (the repository's `examples/prometheus.rs` runs a
//! workload against any store and serves the metrics):
//!
//! ```ignore
//! metrics_exporter_prometheus::PrometheusBuilder::new()
//!     .with_http_listener(([127, 0, 0, 1], 9898))
//!     .install()?;
//! let locks = distlock::connect("redis://127.0.0.1/").await?;
//! ```

#[cfg(not(feature = "metrics"))]
use std::time::Duration;

use crate::{ClaimMode, LockError, LockKey, Operation};

/// The name of every metric distlock records, with its kind and meaning: what the
/// exporter's `HELP` lines say.
pub const METRICS: &[MetricInfo] = &[
    MetricInfo {
        name: ACQUIRE_WAIT,
        kind: MetricKind::Histogram,
        help: "Seconds from an acquire or try_acquire call to its answer, by outcome",
    },
    MetricInfo {
        name: ACQUIRE_ATTEMPT,
        kind: MetricKind::Histogram,
        help: "Seconds of one store round trip of an acquisition, by outcome",
    },
    MetricInfo {
        name: CONTENTION,
        kind: MetricKind::Counter,
        help: "Acquisition attempts the store answered with: held by another owner",
    },
    MetricInfo {
        name: ACQUISITIONS,
        kind: MetricKind::Counter,
        help: "Holds granted by the store, by mode (re-entries not counted)",
    },
    MetricInfo {
        name: HOLD,
        kind: MetricKind::Histogram,
        help: "Seconds from a grant to the answer to its release",
    },
    MetricInfo {
        name: HOLDS,
        kind: MetricKind::Gauge,
        help: "Holds this process has in the store",
    },
    MetricInfo {
        name: RENEWALS,
        kind: MetricKind::Counter,
        help: "Watchdog renewals, by outcome (extended, failed, not_held)",
    },
    MetricInfo {
        name: LOST,
        kind: MetricKind::Counter,
        help: "Holds whose lost signal fired",
    },
    MetricInfo {
        name: BACKGROUND_RELEASES,
        kind: MetricKind::Gauge,
        help: "Releases running in the background (dropped guards, cancelled acquisitions) not yet answered",
    },
    MetricInfo {
        name: STORE_ERRORS,
        kind: MetricKind::Counter,
        help: "Failed store calls, by operation and kind of error",
    },
];

/// `distlock_acquire_wait_seconds`: see the [module docs](self).
pub const ACQUIRE_WAIT: &str = "distlock_acquire_wait_seconds";
/// `distlock_acquire_attempt_seconds`: see the [module docs](self).
pub const ACQUIRE_ATTEMPT: &str = "distlock_acquire_attempt_seconds";
/// `distlock_contention_total`: see the [module docs](self).
pub const CONTENTION: &str = "distlock_contention_total";
/// `distlock_acquisitions_total`: see the [module docs](self).
pub const ACQUISITIONS: &str = "distlock_acquisitions_total";
/// `distlock_hold_seconds`: see the [module docs](self).
pub const HOLD: &str = "distlock_hold_seconds";
/// `distlock_holds`: see the [module docs](self).
pub const HOLDS: &str = "distlock_holds";
/// `distlock_renewals_total`: see the [module docs](self).
pub const RENEWALS: &str = "distlock_renewals_total";
/// `distlock_locks_lost_total`: see the [module docs](self).
pub const LOST: &str = "distlock_locks_lost_total";
/// `distlock_background_releases`: see the [module docs](self).
pub const BACKGROUND_RELEASES: &str = "distlock_background_releases";
/// `distlock_store_errors_total`: see the [module docs](self).
pub const STORE_ERRORS: &str = "distlock_store_errors_total";

/// One metric distlock records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricInfo {
    /// Its name, as exporters show it (Prometheus appends `_bucket`, `_sum`, `_count` to
    /// histograms, or quantiles, depending on its configuration).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// What it measures.
    pub help: &'static str,
}

/// The kind of a [`MetricInfo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of observed values (seconds).
    Histogram,
}

/// How a call to `acquire`/`try_acquire` ended, for [`ACQUIRE_WAIT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    Acquired,
    Contended,
    Timeout,
    Error,
    Cancelled,
}

impl WaitOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WaitOutcome::Acquired => "acquired",
            WaitOutcome::Contended => "contended",
            WaitOutcome::Timeout => "timeout",
            WaitOutcome::Error => "error",
            WaitOutcome::Cancelled => "cancelled",
        }
    }
}

/// How one store attempt of an acquisition ended, for [`ACQUIRE_ATTEMPT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    Acquired,
    Held,
    Error,
}

/// How a watchdog renewal ended, for [`RENEWALS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenewalOutcome {
    Extended,
    Failed,
    NotHeld,
}

impl RenewalOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RenewalOutcome::Extended => "extended",
            RenewalOutcome::Failed => "failed",
            RenewalOutcome::NotHeld => "not_held",
        }
    }
}

/// What a client records about its locks: the backend's name, whether keys are labels, and
/// the metric keys of its events. Cheap to clone; without the `metrics` feature every method
/// is empty.
#[derive(Clone, Debug)]
pub(crate) struct Meter {
    #[cfg(feature = "metrics")]
    backend: &'static str,
    #[cfg(feature = "metrics")]
    by_key: bool,
    #[cfg(feature = "metrics")]
    keys: std::sync::Arc<recording::Keys>,
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::unused_self)]
impl Meter {
    pub(crate) fn new(_backend: &'static str, _by_key: bool) -> Self {
        Meter {}
    }
    #[inline]
    pub(crate) fn waited(&self, _key: &LockKey, _outcome: WaitOutcome, _waited: Duration) {}
    #[inline]
    pub(crate) fn attempt(&self, _key: &LockKey, _outcome: AttemptOutcome, _took: Duration) {}
    #[inline]
    pub(crate) fn granted(&self, _key: &LockKey, _mode: ClaimMode) {}
    #[inline]
    pub(crate) fn hold_ended(&self, _key: &LockKey) {}
    #[inline]
    pub(crate) fn released(&self, _key: &LockKey, _held: Duration) {}
    #[inline]
    pub(crate) fn renewal(&self, _key: &LockKey, _outcome: RenewalOutcome) {}
    #[inline]
    pub(crate) fn lost(&self, _key: &LockKey) {}
    #[inline]
    pub(crate) fn store_error(&self, _key: &LockKey, _operation: Operation, _error: &LockError) {}
    #[inline]
    pub(crate) fn background_release(&self, _key: &LockKey) -> BackgroundRelease {
        BackgroundRelease {}
    }
}

/// Counts one background release in [`BACKGROUND_RELEASES`] while it lives.
#[derive(Debug)]
pub(crate) struct BackgroundRelease {
    #[cfg(feature = "metrics")]
    gauge: ::metrics::Gauge,
}

#[cfg(feature = "metrics")]
impl Drop for BackgroundRelease {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

#[cfg(feature = "metrics")]
mod recording {
    use std::time::Duration;

    use ::metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};

    use super::*;

    impl AttemptOutcome {
        pub(crate) fn as_str(self) -> &'static str {
            match self {
                AttemptOutcome::Acquired => "acquired",
                AttemptOutcome::Held => "held",
                AttemptOutcome::Error => "error",
            }
        }
    }

    /// The `operation` label of [`STORE_ERRORS`].
    pub(super) fn operation_label(operation: Operation) -> &'static str {
        match operation {
            Operation::Acquire => "acquire",
            Operation::Release => "release",
            Operation::Extend => "extend",
            Operation::Renew => "renew",
            Operation::Inspect => "inspect",
            Operation::ForceRelease => "force_release",
        }
    }

    /// The `kind` label of [`STORE_ERRORS`]; `None` for errors that are not a store's.
    pub(super) fn error_kind(error: &LockError) -> Option<&'static str> {
        match error {
            LockError::Unavailable { .. } => Some("unavailable"),
            LockError::QuorumNotReached { .. } => Some("quorum_not_reached"),
            LockError::Backend { .. } => Some("backend"),
            _ => None,
        }
    }

    /// The `mode` label of [`ACQUISITIONS`].
    pub(super) fn mode_label(mode: ClaimMode) -> &'static str {
        match mode {
            ClaimMode::Exclusive => "exclusive",
            ClaimMode::Shared => "shared",
            ClaimMode::Permits => "semaphore",
        }
    }

    /// What the `metrics` macros pass with every event (their target and module path).
    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    const WAIT_OUTCOMES: [WaitOutcome; 5] = [
        WaitOutcome::Acquired,
        WaitOutcome::Contended,
        WaitOutcome::Timeout,
        WaitOutcome::Error,
        WaitOutcome::Cancelled,
    ];
    const ATTEMPT_OUTCOMES: [AttemptOutcome; 3] = [
        AttemptOutcome::Acquired,
        AttemptOutcome::Held,
        AttemptOutcome::Error,
    ];
    const MODES: [ClaimMode; 3] = [ClaimMode::Exclusive, ClaimMode::Shared, ClaimMode::Permits];
    const RENEWAL_OUTCOMES: [RenewalOutcome; 3] = [
        RenewalOutcome::Extended,
        RenewalOutcome::Failed,
        RenewalOutcome::NotHeld,
    ];

    /// The key of every event of a meter whose keys are not labels, made once with the
    /// meter: an event then costs the recorder's lookup, not a vector of labels and a hash,
    /// six of each on every cycle, which a store in memory would feel (lockbench `memory
    /// --case uncontended` with `--metrics`). Store errors are rare and keep making their
    /// keys.
    #[derive(Debug)]
    pub(crate) struct Keys {
        waited: [Key; WAIT_OUTCOMES.len()],
        attempt: [Key; ATTEMPT_OUTCOMES.len()],
        contention: Key,
        granted: [Key; MODES.len()],
        holds: Key,
        hold: Key,
        renewal: [Key; RENEWAL_OUTCOMES.len()],
        lost: Key,
        background: Key,
    }

    impl Keys {
        fn new(backend: &'static str) -> Self {
            let key = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
                let mut labels = vec![Label::from_static_parts("backend", backend)];
                labels.extend(extra.map(|(k, v)| Label::from_static_parts(k, v)));
                Key::from_parts(name, labels)
            };
            Keys {
                waited: WAIT_OUTCOMES.map(|o| key(ACQUIRE_WAIT, Some(("outcome", o.as_str())))),
                attempt: ATTEMPT_OUTCOMES
                    .map(|o| key(ACQUIRE_ATTEMPT, Some(("outcome", o.as_str())))),
                contention: key(CONTENTION, None),
                granted: MODES.map(|m| key(ACQUISITIONS, Some(("mode", mode_label(m))))),
                holds: key(HOLDS, None),
                hold: key(HOLD, None),
                renewal: RENEWAL_OUTCOMES.map(|o| key(RENEWALS, Some(("outcome", o.as_str())))),
                lost: key(LOST, None),
                background: key(BACKGROUND_RELEASES, None),
            }
        }
    }

    impl Meter {
        /// A meter for a client of `backend`; describes every metric to the recorder
        /// installed now (a recorder installed later just has no descriptions).
        pub(crate) fn new(backend: &'static str, by_key: bool) -> Self {
            for m in METRICS {
                match m.kind {
                    MetricKind::Counter => ::metrics::describe_counter!(m.name, m.help),
                    MetricKind::Gauge => ::metrics::describe_gauge!(m.name, m.help),
                    MetricKind::Histogram => {
                        ::metrics::describe_histogram!(m.name, ::metrics::Unit::Seconds, m.help)
                    }
                }
            }
            Meter {
                backend,
                by_key,
                keys: std::sync::Arc::new(Keys::new(backend)),
            }
        }

        /// The labels of one event: the backend, the key if asked for, then `extra`.
        fn labels<const N: usize>(
            &self,
            key: &LockKey,
            extra: [(&'static str, &'static str); N],
        ) -> Vec<Label> {
            let mut labels = Vec::with_capacity(N + 2);
            labels.push(Label::from_static_parts("backend", self.backend));
            if self.by_key {
                labels.push(Label::new("key", key.as_str().to_owned()));
            }
            labels.extend(extra.map(|(k, v)| Label::from_static_parts(k, v)));
            labels
        }

        /// Registers the metric of one event with the recorder installed now: under `fixed`,
        /// or, where keys are labels, under a key made with `key` and `extra`.
        fn register<T, const N: usize>(
            &self,
            fixed: &Key,
            key: &LockKey,
            extra: [(&'static str, &'static str); N],
            register: impl FnOnce(&dyn Recorder, &Key, &Metadata<'static>) -> T,
        ) -> T {
            if self.by_key {
                let labelled = Key::from_parts(fixed.name_shared(), self.labels(key, extra));
                ::metrics::with_recorder(|r| register(r, &labelled, &METADATA))
            } else {
                ::metrics::with_recorder(|r| register(r, fixed, &METADATA))
            }
        }

        fn counter<const N: usize>(
            &self,
            fixed: &Key,
            key: &LockKey,
            extra: [(&'static str, &'static str); N],
        ) -> Counter {
            self.register(fixed, key, extra, |r, k, m| r.register_counter(k, m))
        }

        fn gauge(&self, fixed: &Key, key: &LockKey) -> Gauge {
            self.register(fixed, key, [], |r, k, m| r.register_gauge(k, m))
        }

        fn histogram<const N: usize>(
            &self,
            fixed: &Key,
            key: &LockKey,
            extra: [(&'static str, &'static str); N],
        ) -> Histogram {
            self.register(fixed, key, extra, |r, k, m| r.register_histogram(k, m))
        }

        pub(crate) fn waited(&self, key: &LockKey, outcome: WaitOutcome, waited: Duration) {
            let fixed = &self.keys.waited[outcome as usize];
            self.histogram(fixed, key, [("outcome", outcome.as_str())])
                .record(waited.as_secs_f64());
        }

        pub(crate) fn attempt(&self, key: &LockKey, outcome: AttemptOutcome, took: Duration) {
            let fixed = &self.keys.attempt[outcome as usize];
            self.histogram(fixed, key, [("outcome", outcome.as_str())])
                .record(took.as_secs_f64());
            if outcome == AttemptOutcome::Held {
                self.counter(&self.keys.contention, key, []).increment(1);
            }
        }

        pub(crate) fn granted(&self, key: &LockKey, mode: ClaimMode) {
            let fixed = &self.keys.granted[mode as usize];
            self.counter(fixed, key, [("mode", mode_label(mode))])
                .increment(1);
            self.gauge(&self.keys.holds, key).increment(1.0);
        }

        pub(crate) fn hold_ended(&self, key: &LockKey) {
            self.gauge(&self.keys.holds, key).decrement(1.0);
        }

        pub(crate) fn released(&self, key: &LockKey, held: Duration) {
            self.histogram(&self.keys.hold, key, [])
                .record(held.as_secs_f64());
        }

        pub(crate) fn renewal(&self, key: &LockKey, outcome: RenewalOutcome) {
            let fixed = &self.keys.renewal[outcome as usize];
            self.counter(fixed, key, [("outcome", outcome.as_str())])
                .increment(1);
        }

        pub(crate) fn lost(&self, key: &LockKey) {
            self.counter(&self.keys.lost, key, []).increment(1);
        }

        pub(crate) fn store_error(&self, key: &LockKey, operation: Operation, error: &LockError) {
            let Some(kind) = error_kind(error) else {
                return;
            };
            let labels = self.labels(
                key,
                [("operation", operation_label(operation)), ("kind", kind)],
            );
            ::metrics::counter!(STORE_ERRORS, labels).increment(1);
        }

        pub(crate) fn background_release(&self, key: &LockKey) -> BackgroundRelease {
            let gauge = self.gauge(&self.keys.background, key);
            gauge.increment(1.0);
            BackgroundRelease { gauge }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The value of `key`'s label `name`.
        fn label(key: &Key, name: &str) -> Option<String> {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        }

        /// Each event's key names the backend and its own outcome or mode: the keys are
        /// made and looked up in the order of their enums.
        #[test]
        fn each_event_has_the_key_of_its_labels() {
            let keys = Keys::new("memory");
            for o in WAIT_OUTCOMES {
                let key = &keys.waited[o as usize];
                assert_eq!(key.name(), ACQUIRE_WAIT);
                assert_eq!(label(key, "outcome").as_deref(), Some(o.as_str()));
                assert_eq!(label(key, "backend").as_deref(), Some("memory"));
            }
            for o in ATTEMPT_OUTCOMES {
                let key = &keys.attempt[o as usize];
                assert_eq!(key.name(), ACQUIRE_ATTEMPT);
                assert_eq!(label(key, "outcome").as_deref(), Some(o.as_str()));
            }
            for m in MODES {
                let key = &keys.granted[m as usize];
                assert_eq!(key.name(), ACQUISITIONS);
                assert_eq!(label(key, "mode").as_deref(), Some(mode_label(m)));
            }
            for o in RENEWAL_OUTCOMES {
                let key = &keys.renewal[o as usize];
                assert_eq!(key.name(), RENEWALS);
                assert_eq!(label(key, "outcome").as_deref(), Some(o.as_str()));
            }
            for (key, name) in [
                (&keys.contention, CONTENTION),
                (&keys.holds, HOLDS),
                (&keys.hold, HOLD),
                (&keys.lost, LOST),
                (&keys.background, BACKGROUND_RELEASES),
            ] {
                assert_eq!(key.name(), name);
                assert_eq!(key.labels().count(), 1, "{name}: the backend only");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_listed_once_with_the_prefix() {
        let mut names: Vec<_> = METRICS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len());
        assert!(names.iter().all(|n| n.starts_with("distlock_")));
        for m in METRICS {
            let counter = m.name.ends_with("_total");
            assert_eq!(counter, m.kind == MetricKind::Counter, "{}", m.name);
            let seconds = m.name.ends_with("_seconds");
            assert_eq!(seconds, m.kind == MetricKind::Histogram, "{}", m.name);
        }
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn labels_name_every_operation_and_store_error() {
        use super::recording::{error_kind, mode_label, operation_label};

        let ops = [
            Operation::Acquire,
            Operation::Release,
            Operation::Extend,
            Operation::Renew,
            Operation::Inspect,
            Operation::ForceRelease,
        ];
        let mut labels: Vec<_> = ops.iter().map(|o| operation_label(*o)).collect();
        labels.dedup();
        assert_eq!(labels.len(), ops.len());
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            error_kind(&LockError::unavailable("x", io)),
            Some("unavailable")
        );
        assert_eq!(error_kind(&LockError::config("bad")), None);
        assert_eq!(mode_label(ClaimMode::Shared), "shared");
    }
}
