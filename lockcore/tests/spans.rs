//! The `tracing` spans of lock operations: their names and the fields a subscriber sees
//! (key, backend, outcome, token), caught by a subscriber of the test's own on the test's
//! thread (a current-thread runtime runs the background work there too).
//!
//! A test binary of its own: `tracing` caches each callsite's interest process-wide, and
//! lock operations of tests running beside it on other threads (with no subscriber) raced
//! that cache under load, so a span of this test could go unrecorded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

use distlock_core::memory::MemoryBackend;
use distlock_core::{LockClient, LockError};

type Fields = BTreeMap<String, String>;

/// Every span opened, in order: its name and its fields as last recorded.
#[derive(Clone, Default)]
struct Spans {
    spans: Arc<Mutex<Vec<(&'static str, Fields)>>>,
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields::new();
        span.record(&mut Collect(&mut fields));
        let mut spans = self.spans.lock().unwrap();
        spans.push((span.metadata().name(), fields));
        Id::from_u64(spans.len() as u64)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut spans = self.spans.lock().unwrap();
        if let Some((_, fields)) = spans.get_mut(span.into_u64() as usize - 1) {
            values.record(&mut Collect(fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Spans {
    /// The spans named `name`, their fields.
    fn named(&self, name: &str) -> Vec<Fields> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, f)| f.clone())
            .collect()
    }
}

fn field<'a>(fields: &'a Fields, name: &str) -> &'a str {
    fields.get(name).map_or("<none>", String::as_str)
}

#[test]
fn every_lock_operation_has_a_span_with_key_backend_outcome_and_token() {
    let spans = Spans::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(spans.clone(), || {
        runtime.block_on(async {
            let locks = LockClient::new(MemoryBackend::new());
            let guard = locks
                .lock("span-key")
                .ttl(Duration::from_millis(300))
                .acquire()
                .await
                .unwrap();
            let token = guard.token().get().to_string();
            assert!(locks
                .lock("span-key")
                .try_acquire()
                .await
                .unwrap()
                .is_none());
            let timeout = locks
                .lock("span-key")
                .wait(Duration::from_millis(10))
                .acquire()
                .await;
            assert!(matches!(timeout, Err(LockError::Timeout { .. })));
            guard.extend().await.unwrap();
            // The watchdog renews at ttl / 3: wait for its span's outcome.
            let renewed = || {
                spans
                    .named("distlock.renew")
                    .iter()
                    .any(|f| field(f, "outcome") == "extended")
            };
            let waiting = std::time::Instant::now();
            while !renewed() {
                assert!(waiting.elapsed() < Duration::from_secs(10), "no renewal");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            locks.inspect("span-key").await.unwrap();
            guard.release().await.unwrap();
            locks.force_release("span-key").await.unwrap();

            let acquires = spans.named("distlock.acquire");
            assert_eq!(acquires.len(), 3, "{acquires:?}");
            let outcomes: Vec<_> = acquires.iter().map(|f| field(f, "outcome")).collect();
            assert_eq!(outcomes, ["acquired", "contended", "timeout"]);
            assert_eq!(field(&acquires[0], "token"), token);
            assert_eq!(field(&acquires[1], "token"), "<none>");
            for f in &acquires {
                assert_eq!(field(f, "key"), "span-key");
                assert_eq!(field(f, "backend"), "memory");
                assert_eq!(field(f, "mode"), "exclusive");
            }
            let kinds: Vec<_> = acquires.iter().map(|f| field(f, "kind")).collect();
            assert_eq!(kinds, ["wait", "try", "wait"]);

            let extends = spans.named("distlock.extend");
            assert_eq!(extends.len(), 1);
            assert_eq!(field(&extends[0], "outcome"), "extended");
            assert_eq!(field(&extends[0], "token"), token);

            let renewals = spans.named("distlock.renew");
            assert!(renewals.iter().all(|f| field(f, "token") == token));
            assert!(renewals.iter().all(|f| field(f, "key") == "span-key"));

            let releases = spans.named("distlock.release");
            assert_eq!(releases.len(), 1);
            assert_eq!(field(&releases[0], "outcome"), "released");
            assert_eq!(field(&releases[0], "token"), token);
            assert_eq!(field(&releases[0], "key"), "span-key");

            assert_eq!(spans.named("distlock.inspect").len(), 1);
            assert_eq!(spans.named("distlock.force_release").len(), 1);
            let all = spans.spans.lock().unwrap().clone();
            for (name, fields) in &all {
                assert!(name.starts_with("distlock."), "{name}");
                assert!(
                    fields.values().all(|v| !v.contains("OwnerToken")),
                    "{name}: {fields:?}"
                );
            }
        });
    });
}
