//! Several keys at once: a set of three keys taken and released with `lock_all` (ours)
//! against the same three keys taken one by one as single locks and released
//! (`keys3_singles`), and one single-key cycle (`keys3_one`), on the same client.

use std::time::Instant;

use lockcore::driver::BoxError;
use lockcore::{LockClient, ReleaseOutcome};

use crate::cases::{self, Sample, Side, TTL};
use crate::report::{self, Kind, Row};
use crate::Settings;

/// What one cycle takes.
#[derive(Clone, Copy)]
enum Take {
    /// `lock_all` of three keys.
    Set,
    /// Three single locks in sequence.
    Singles,
    /// One single lock.
    One,
}

fn take_of(side: Side) -> Take {
    match side {
        Side::Raw(0) => Take::Singles,
        Side::Raw(_) => Take::One,
        _ => Take::Set,
    }
}

/// The `keys3` rows.
pub async fn rows(
    backend: &'static str,
    s: &Settings,
    client: &LockClient,
    prefix: &str,
) -> Result<Vec<Row>, BoxError> {
    if !s.runs("keys3") {
        return Ok(Vec::new());
    }
    let sides = [Side::Ours, Side::Raw(0), Side::Raw(1)];
    let mut slice_no = 0u32;
    let got = cases::compare(s, &sides, |side, until, cap| {
        slice_no += 1;
        let keys: Vec<String> = (0..3)
            .map(|i| format!("{prefix}:k3:{slice_no}:{i}"))
            .collect();
        let client = client.clone();
        async move { cycles(&client, &keys, take_of(side), until, cap).await }
    })
    .await
    .map_err(|e| format!("{backend}/keys3: {e}"))?;
    let mut got = got.into_iter();
    let ours = got.next().unwrap_or_default();
    let names = ["keys3_singles", "keys3_one"];
    let baselines = names.iter().map(|n| n.to_string()).zip(got).collect();
    Ok(report::group(
        backend,
        "keys3",
        Kind::Cycles,
        ours,
        baselines,
    ))
}

/// Acquire+release cycles of `take` over `keys`, one task.
async fn cycles(
    client: &LockClient,
    keys: &[String],
    take: Take,
    until: Instant,
    cap: u64,
) -> Result<Sample, BoxError> {
    let mut sample = Sample::default();
    let start = Instant::now();
    let mut t0 = start;
    while sample.ops < cap && t0 < until {
        let released = match take {
            Take::Set => {
                let set = client
                    .lock_all(keys.iter().cloned())
                    .ttl(TTL)
                    .acquire()
                    .await?;
                std::hint::black_box(set.tokens().count());
                set.release().await?
            }
            Take::Singles => {
                let mut guards = Vec::with_capacity(keys.len());
                for key in keys {
                    guards.push(client.lock(key.as_str()).ttl(TTL).acquire().await?);
                }
                let mut last = ReleaseOutcome::Released;
                for guard in guards {
                    last = guard.release().await?;
                }
                last
            }
            Take::One => {
                let key = keys.first().map(String::as_str).unwrap_or("k3");
                let guard = client.lock(key).ttl(TTL).acquire().await?;
                std::hint::black_box(guard.token());
                guard.release().await?
            }
        };
        if released != ReleaseOutcome::Released {
            return Err(format!("release of an uncontended set said {released:?}").into());
        }
        let t1 = Instant::now();
        sample
            .lat
            .push(u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX));
        sample.ops += 1;
        t0 = t1;
    }
    sample.elapsed = start.elapsed();
    Ok(sample)
}
