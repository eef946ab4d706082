//! distlock's metrics on a Prometheus endpoint, while a small workload takes locks.
//!
//! ```text
//! cargo run --example prometheus --features metrics,redis -- redis://127.0.0.1/
//! curl -s http://127.0.0.1:9898/metrics | grep ^distlock_
//! ```
//!
//! Arguments: `[URL] [--listen ADDR] [--ttl-ms N] [--prefix P]`; the URL defaults to
//! `memory:`, the endpoint to `127.0.0.1:9898`, the TTL to 2000 ms. The workload: four
//! workers contend for one key (some release their guard, some drop it and let it be
//! released in the background), a leader holds a key for several TTLs (the watchdog renews
//! it), a prober makes single `try_acquire` attempts, and an impatient task gives up on its
//! acquisitions (cancelled). Stop the store for longer than the TTL and watch renewals fail,
//! store errors climb and `distlock_locks_lost_total` count the holds that were lost.
//!
//! Metrics are recorded into whatever recorder is installed; the one here is
//! `metrics-exporter-prometheus` with buckets for every `_seconds` histogram.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use distlock::{LockClient, LockError};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// What the example runs against and where it serves its metrics.
#[derive(Clone, Debug)]
pub struct Options {
    /// The store (`distlock::connect` URL).
    pub url: String,
    /// The address of the `/metrics` endpoint.
    pub listen: SocketAddr,
    /// The TTL of every lock.
    pub ttl: Duration,
    /// Prefix of the keys the workload uses.
    pub prefix: String,
}

impl Options {
    /// Parses `[URL] [--listen ADDR] [--ttl-ms N] [--prefix P]`.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut options = Options {
            url: "memory:".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 9898)),
            ttl: Duration::from_millis(2000),
            prefix: "example".into(),
        };
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
            match arg.as_str() {
                "--listen" => {
                    let v = value("--listen")?;
                    options.listen = v.parse().map_err(|e| format!("--listen {v}: {e}"))?;
                }
                "--ttl-ms" => {
                    let v = value("--ttl-ms")?;
                    let ms: u64 = v.parse().map_err(|e| format!("--ttl-ms {v}: {e}"))?;
                    options.ttl = Duration::from_millis(ms);
                }
                "--prefix" => options.prefix = value("--prefix")?,
                flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
                url => options.url = url.to_owned(),
            }
        }
        Ok(options)
    }
}

/// Histogram buckets (seconds): from a fast store round trip to a long wait.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// Installs the exporter, connects, and runs the workload until the process ends.
pub async fn run(options: Options) -> Result<(), Box<dyn Error>> {
    PrometheusBuilder::new()
        .with_http_listener(options.listen)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
        .install()?;
    let locks = distlock::connect(&options.url).await?;
    eprintln!(
        "metrics at http://{}/metrics; locking on {}",
        options.listen,
        distlock::redact(&options.url)
    );
    let key = |name: &str| format!("{}:{name}", options.prefix);
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..4 {
        tasks.spawn(contend(locks.clone(), key("jobs"), options.ttl, worker));
    }
    tasks.spawn(lead(locks.clone(), key("leader"), options.ttl));
    tasks.spawn(probe(locks.clone(), key("jobs")));
    tasks.spawn(give_up(locks.clone(), key("jobs"), options.ttl));
    while let Some(done) = tasks.join_next().await {
        done?;
    }
    Ok(())
}

/// Takes the shared key in turn with the other workers; odd workers drop their guard (a
/// background release), even ones release it.
async fn contend(locks: LockClient, key: String, ttl: Duration, worker: u32) {
    loop {
        let request = locks.lock(&key).ttl(ttl).wait(ttl * 2);
        match request.acquire().await {
            Ok(guard) => {
                tokio::time::sleep(Duration::from_millis(20 + 10 * u64::from(worker))).await;
                if worker % 2 == 1 {
                    drop(guard);
                } else if let Err(e) = guard.release().await {
                    eprintln!("worker {worker}: {e}");
                }
            }
            Err(e) => pause_after(&e, worker).await,
        }
    }
}

/// Holds a key for three TTLs at a time, renewed by the watchdog, and says when it lost it.
async fn lead(locks: LockClient, key: String, ttl: Duration) {
    loop {
        match locks.lock(&key).ttl(ttl).acquire().await {
            Ok(guard) => {
                tokio::select! {
                    _ = guard.lost() => eprintln!("leader: lost {key} (token {})", guard.token()),
                    _ = tokio::time::sleep(ttl * 3) => {}
                }
                drop(guard);
            }
            Err(e) => pause_after(&e, 100).await,
        }
    }
}

/// One attempt every 50 ms: contended most of the time.
async fn probe(locks: LockClient, key: String) {
    loop {
        match locks.lock(&key).try_acquire().await {
            Ok(Some(guard)) => drop(guard.release().await),
            Ok(None) => {}
            Err(e) => pause_after(&e, 200).await,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits at most 5 ms for the key, by dropping the acquisition: a cancelled wait.
async fn give_up(locks: LockClient, key: String, ttl: Duration) {
    loop {
        let acquire = locks.lock(&key).ttl(ttl).acquire();
        if let Ok(Ok(guard)) = tokio::time::timeout(Duration::from_millis(5), acquire).await {
            drop(guard.release().await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn pause_after(e: &LockError, who: u32) {
    if !matches!(e, LockError::Timeout { .. }) {
        eprintln!("task {who}: {e}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::main]
async fn main() {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("prometheus example: {e}\nusage: prometheus [URL] [--listen ADDR] [--ttl-ms N] [--prefix P]");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(options).await {
        // The error and its causes on one line.
        eprintln!("prometheus example: {}", distlock::ErrorChain(&*e));
        std::process::exit(1);
    }
}
