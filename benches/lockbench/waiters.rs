//! Many waiters at once (opt-in with `--case scale`, or `--case scale_waiters`; the smoke
//! run waits with 100):
//!
//! * `scale_waiters_one_key<N>` — one client holds a key; N tasks of another client wait
//!   for it. The holder releases, and each waiter, once granted, releases at once, until
//!   all N had the key.
//! * `scale_waiters_keys<N>` — one client holds N keys; N tasks of another client wait, one
//!   per key. The holder releases them all (64 tasks at a time); each waiter releases at
//!   once when granted.
//!
//! Reported per row: `connections` — TCP connections the waiting client opened (counted
//! from this process's sockets before its first request and while all wait);
//! `bytes_per_waiter` — resident memory growth while all wait, per waiter (the waiting
//! task included: what an application pays per waiter); `wakeups_per_release` —
//! `wait_released` calls that returned, per release; `gap_p50_us`, `gap_p99_us`,
//! `gap_max_us` — one key: from one grant to the next; many keys: from a key's release to
//! its waiter's grant; `served_s` — from the first release until every waiter had its key.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::driver::BoxError;
use lockcore::{LockBackend, LockClient, LockGuard};
use serde_json::json;

use crate::cases::Sample;
use crate::report::{self, Kind, Row};
use crate::scale::rss_bytes;
use crate::target::{CountingBackend, Target};
use crate::Settings;

/// The TTL of every lock taken: longer than any run, so only releases free keys.
const TTL: Duration = Duration::from_secs(30);

/// How long all waiters may take to line up, and to be served.
const LIMIT: Duration = Duration::from_secs(600);

/// Tasks releasing the holder's keys in the many-keys case.
const RELEASERS: usize = 64;

/// Whether the waiter cases run: only when asked for by name, and in the smoke run.
pub fn runs(s: &Settings) -> bool {
    s.mode == "test" || s.cases.iter().any(|c| "scale_waiters".contains(c.as_str()))
}

/// The numbers of waiters.
fn counts(s: &Settings) -> Vec<usize> {
    if !s.scale_waiters.is_empty() {
        return s.scale_waiters.clone();
    }
    match s.mode {
        "test" => vec![100],
        "quick" => vec![1_000],
        _ => vec![10_000],
    }
}

/// The rows: per number of waiters, one key and as many keys.
pub async fn rows<T: Target>(target: &T, s: &Settings, prefix: &str) -> Result<Vec<Row>, BoxError> {
    let mut rows = Vec::new();
    for n in counts(s) {
        rows.push(run(target, prefix, n, Layout::OneKey).await?);
        rows.push(run(target, prefix, n, Layout::Keys).await?);
    }
    Ok(rows)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    OneKey,
    Keys,
}

impl Layout {
    fn case(self, n: usize) -> String {
        match self {
            Layout::OneKey => format!("scale_waiters_one_key{n}"),
            Layout::Keys => format!("scale_waiters_keys{n}"),
        }
    }
}

async fn run<T: Target>(
    target: &T,
    prefix: &str,
    n: usize,
    layout: Layout,
) -> Result<Row, BoxError> {
    let case = layout.case(n);
    let key = |i: usize| match layout {
        Layout::OneKey => format!("{prefix}:{case}"),
        Layout::Keys => format!("{prefix}:{case}:{i}"),
    };
    let holder = LockClient::new(target.backend().await?);
    let held = take(
        &holder,
        (0..n)
            .map(key)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect(),
    )
    .await?;

    let connections_before = tcp_connections();
    let counted = CountingBackend::new(target.backend().await?);
    let as_dyn: Arc<dyn LockBackend> = counted.clone();
    let client = LockClient::new(as_dyn);
    let rss_before = rss_bytes();
    let entered = Arc::new(AtomicUsize::new(0));
    let grants: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (client, entered, grants, k) =
            (client.clone(), entered.clone(), grants.clone(), key(i));
        tasks.push(tokio::spawn(async move {
            entered.fetch_add(1, Ordering::SeqCst);
            let g = client.lock(k.as_str()).ttl(TTL).acquire().await?;
            grants
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((i, Instant::now()));
            g.release().await?;
            Ok::<_, BoxError>(())
        }));
    }
    // Everyone lined up: every task asked, no attempt is in flight any more, and the store
    // is being waited on (one waiter per key at the head of this client's line).
    let heads = match layout {
        Layout::OneKey => 1,
        Layout::Keys => n,
    };
    let lining_up = Instant::now();
    while entered.load(Ordering::SeqCst) < n
        || counted.waiting() < heads
        || counted.attempts().0 > 0
    {
        if let Some(at) = tasks.iter().position(|t| t.is_finished()) {
            // A waiter that ended before any release failed: its error is the row's.
            let ended = tasks.swap_remove(at).await?;
            return Err(match ended {
                Err(e) => format!("{case}: a waiter failed while lining up: {e}").into(),
                Ok(()) => format!("{case}: a waiter was granted a held key").into(),
            });
        }
        if lining_up.elapsed() > LIMIT {
            return Err(format!(
                "{case}: only {} of {n} waiters lined up, {} waiting on the store, in {LIMIT:?}",
                entered.load(Ordering::SeqCst),
                counted.waiting()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rss_waiting = rss_bytes();
    let connections_waiting = tcp_connections();
    let attempts = counted.attempts().1;
    counted.take_wakeups();

    let first_release = Instant::now();
    let released_at = give_back(held).await?;
    let served = tokio::time::timeout(LIMIT, async {
        for t in tasks {
            t.await??;
        }
        Ok::<_, BoxError>(())
    })
    .await;
    match served {
        Ok(r) => r?,
        Err(_) => {
            return Err(format!("{case}: the waiters were not all served in {LIMIT:?}").into())
        }
    }
    let served = first_release.elapsed();
    let wakeups = counted.take_wakeups();
    client.shutdown().await;
    client.backend().shutdown().await;
    holder.shutdown().await;
    holder.backend().shutdown().await;

    let mut grants = std::mem::take(&mut *grants.lock().unwrap_or_else(|e| e.into_inner()));
    let mut gaps: Vec<u64> = match layout {
        Layout::OneKey => {
            grants.sort_by_key(|&(_, at)| at);
            let mut last = released_at.first().map_or(first_release, |&(_, at)| at);
            grants
                .iter()
                .map(|&(_, at)| {
                    let gap = at.saturating_duration_since(last);
                    last = at;
                    micros(gap)
                })
                .collect()
        }
        Layout::Keys => {
            let released: std::collections::HashMap<String, Instant> =
                released_at.into_iter().collect();
            grants
                .iter()
                .filter_map(|&(i, at)| {
                    released
                        .get(&key(i))
                        .map(|&r| micros(at.saturating_duration_since(r)))
                })
                .collect()
        }
    };
    gaps.sort_unstable();
    let pct = |p: f64| -> u64 {
        if gaps.is_empty() {
            return 0;
        }
        gaps[((gaps.len() - 1) as f64 * p).round() as usize]
    };
    let (p50, p99, max) = (pct(0.5), pct(0.99), gaps.last().copied().unwrap_or(0));
    let releases = n as f64;
    let wakeups_per_release = wakeups as f64 / releases;
    let bytes_per_waiter = match (rss_before, rss_waiting) {
        (Some(b), Some(a)) => Some((a.saturating_sub(b) as f64 / n as f64).round()),
        _ => None,
    };
    let connections = match (connections_before, connections_waiting) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b)),
        _ => None,
    };
    let sample = Sample {
        ops: n as u64,
        elapsed: served,
        ..Sample::default()
    };
    let mut got = report::group(T::NAME, &case, Kind::Cycles, sample, Vec::new());
    let mut row = got.pop().ok_or("no row for the case")?;
    for (k, v) in [
        ("waiters", json!(n)),
        ("connections", json!(connections)),
        ("bytes_per_waiter", json!(bytes_per_waiter)),
        (
            "wakeups_per_release",
            json!((wakeups_per_release * 1000.0).round() / 1000.0),
        ),
        ("gap_p50_us", json!(p50)),
        ("gap_p99_us", json!(p99)),
        ("gap_max_us", json!(max)),
        (
            "served_s",
            json!((served.as_secs_f64() * 100.0).round() / 100.0),
        ),
    ] {
        row.extra.insert(k.into(), v);
    }
    let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} B"));
    row.note = Some(format!(
        "{n} waiters on {}: {} connections opened by the waiting client · {} per waiter · \
         {attempts} attempts while lining up · {wakeups_per_release:.2} wake-ups per release · hand-off gap p50 {p50} µs, p99 {p99} µs, \
         max {max} µs · all served in {served:.1?}",
        match layout {
            Layout::OneKey => "one key".to_owned(),
            Layout::Keys => format!("{n} keys"),
        },
        connections.map_or("-".to_owned(), |c| c.to_string()),
        show(bytes_per_waiter),
    ));
    Ok(row)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Takes every key in `keys` (64 tasks at a time).
async fn take(
    client: &LockClient,
    keys: Vec<String>,
) -> Result<Vec<(String, LockGuard)>, BoxError> {
    let keys = Arc::new(keys);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..RELEASERS.min(keys.len()) {
        let (client, keys, next) = (client.clone(), keys.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(k) = keys.get(i) else {
                    return Ok::<_, BoxError>(mine);
                };
                mine.push((k.clone(), client.lock(k.as_str()).ttl(TTL).acquire().await?));
            }
        }));
    }
    let mut held = Vec::with_capacity(keys.len());
    for t in tasks {
        held.extend(t.await??);
    }
    Ok(held)
}

/// Releases every hold (64 tasks at a time): when each release was called.
async fn give_back(held: Vec<(String, LockGuard)>) -> Result<Vec<(String, Instant)>, BoxError> {
    let per = held.len().div_ceil(RELEASERS).max(1);
    let mut held = held.into_iter();
    let mut tasks = Vec::new();
    loop {
        let chunk: Vec<(String, LockGuard)> = held.by_ref().take(per).collect();
        if chunk.is_empty() {
            break;
        }
        tasks.push(tokio::spawn(async move {
            let mut at = Vec::with_capacity(chunk.len());
            for (k, g) in chunk {
                at.push((k, Instant::now()));
                g.release().await?;
            }
            Ok::<_, BoxError>(at)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// The established TCP connections of this process (Linux), if known: its socket inodes
/// matched against the kernel's connection tables.
fn tcp_connections() -> Option<usize> {
    let mut inodes = HashSet::new();
    for fd in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let target = target.to_string_lossy();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(inode.to_owned());
            }
        }
    }
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // `st` 01 is ESTABLISHED; the inode is the tenth field.
            if fields.get(3) == Some(&"01") && fields.get(9).is_some_and(|i| inodes.contains(*i)) {
                count += 1;
            }
        }
    }
    Some(count)
}
