//! The Prometheus example, scraped: every metric docs/metrics.md lists moves while the
//! example's workload runs against the real Redis of `scripts/servers.sh`, with the store
//! cut off for longer than the TTL midway (a loopback proxy holds the traffic) so renewals
//! fail, store errors are counted, holds are lost and dropped guards wait to be released.
#![cfg(all(feature = "metrics", feature = "redis"))]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conformance_tests::process::free_port;
use conformance_tests::{FaultLink, TcpProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../examples/prometheus.rs"]
#[allow(dead_code)]
mod example;

/// The example's TTL: the store is cut off for longer than this.
const TTL: Duration = Duration::from_millis(1000);

/// One scrape: the sum of every sample per metric (histograms by their `_count`), and
/// each sample line as printed.
#[derive(Debug, Default)]
struct Scrape {
    totals: BTreeMap<String, f64>,
    samples: Vec<String>,
}

impl Scrape {
    fn parse(body: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in body.lines().filter(|l| l.starts_with("distlock_")) {
            scrape.samples.push(line.to_owned());
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            let name = match name.strip_suffix("_count") {
                Some(histogram) => histogram,
                None if name.ends_with("_bucket") || name.ends_with("_sum") => continue,
                None => name,
            };
            let value: f64 = value.parse().unwrap_or(f64::NAN);
            *scrape.totals.entry(name.to_owned()).or_default() += value;
        }
        scrape
    }

    fn total(&self, name: &str) -> f64 {
        self.totals.get(name).copied().unwrap_or(0.0)
    }

    /// The sum of the samples of `name` whose labels contain `label`.
    fn with_label(&self, name: &str, label: &str) -> f64 {
        let count = format!("{name}_count{{");
        let plain = format!("{name}{{");
        self.samples
            .iter()
            .filter(|s| (s.starts_with(&count) || s.starts_with(&plain)) && s.contains(label))
            .filter_map(|s| s.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }
}

async fn scrape(addr: SocketAddr) -> std::io::Result<Scrape> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    conn.read_to_string(&mut response).await?;
    if !response.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!(
            "scrape answered: {}",
            response.lines().next().unwrap_or("")
        )));
    }
    Ok(Scrape::parse(&response))
}

/// The metric names of docs/metrics.md's table.
fn documented() -> BTreeSet<String> {
    let doc = include_str!("../docs/metrics.md");
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `distlock_"))
        .filter_map(|l| l.split('`').next())
        .map(|name| format!("distlock_{name}"))
        .collect()
}

#[test]
fn the_docs_list_every_metric_the_code_records() {
    let code: BTreeSet<String> = distlock::metrics::METRICS
        .iter()
        .map(|m| m.name.to_owned())
        .collect();
    assert_eq!(documented(), code);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_moves_in_the_prometheus_example() {
    let redis = std::env::var("DISTLOCK_TEST_REDIS_URL")
        .expect("run scripts/servers.sh start (DISTLOCK_TEST_REDIS_URL)");
    let upstream = url::Url::parse(&redis)
        .expect("DISTLOCK_TEST_REDIS_URL is a URL")
        .socket_addrs(|| Some(6379))
        .expect("DISTLOCK_TEST_REDIS_URL names an address")[0];
    let proxy = TcpProxy::start(upstream).await.expect("proxy");
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port().expect("a free port")));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let options = example::Options::parse(
        [
            format!("redis://{}/?timeout=200ms", proxy.addr()),
            "--listen".into(),
            listen.to_string(),
            "--ttl-ms".into(),
            TTL.as_millis().to_string(),
            "--prefix".into(),
            format!("metrics-example:{}-{nanos}", std::process::id()),
        ]
        .into_iter(),
    )
    .expect("options");
    let workload =
        tokio::spawn(async move { example::run(options).await.map_err(|e| e.to_string()) });

    // Up, and locking.
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        assert!(
            !workload.is_finished(),
            "the example stopped: {:?}",
            workload.await
        );
        if let Ok(s) = scrape(listen).await {
            if s.total("distlock_renewals_total") > 0.0 {
                seen.push(s);
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no renewal within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Cut off for twice the TTL: renewals fail, holds are lost, dropped guards wait.
    proxy.pause().await;
    let cut = Instant::now();
    while cut.elapsed() < TTL * 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen.push(
            scrape(listen)
                .await
                .expect("scrape while the store is cut off"),
        );
    }
    proxy.resume().await;

    // Back: the workload takes locks again, and contends for them.
    let at_resume = seen.last().expect("scrapes").totals.clone();
    let grew = |s: &Scrape, name: &str| s.total(name) > at_resume.get(name).copied().unwrap_or(0.0);
    let back = Instant::now();
    loop {
        let s = scrape(listen)
            .await
            .expect("scrape after the store is back");
        let recovered =
            grew(&s, "distlock_acquisitions_total") && grew(&s, "distlock_contention_total");
        seen.push(s);
        if recovered {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(20),
            "no lock taken within 20 s of recovery"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    workload.abort();

    let last = seen.last().expect("scrapes");
    let mut still = Vec::new();
    for name in documented() {
        // Counters and histograms counted something (the recorder is this test's: it
        // started from nothing); gauges were above zero at some scrape.
        let moved = if name.ends_with("_total") || name.ends_with("_seconds") {
            last.total(&name) > 0.0
        } else {
            seen.iter().any(|s| s.total(&name) > 0.0)
        };
        if !moved {
            still.push(name);
        }
    }
    assert!(
        still.is_empty(),
        "metrics that did not move: {still:?}\nlast scrape:\n{}",
        last.samples.join("\n")
    );
    // The labels the docs promise, seen with values.
    for (name, label) in [
        ("distlock_renewals_total", "outcome=\"extended\""),
        ("distlock_renewals_total", "outcome=\"failed\""),
        ("distlock_acquire_wait_seconds", "outcome=\"acquired\""),
        ("distlock_acquire_wait_seconds", "outcome=\"contended\""),
        ("distlock_acquire_wait_seconds", "outcome=\"cancelled\""),
        ("distlock_acquire_attempt_seconds", "outcome=\"held\""),
        ("distlock_acquisitions_total", "mode=\"exclusive\""),
        ("distlock_store_errors_total", "kind=\"unavailable\""),
        ("distlock_store_errors_total", "operation=\"renew\""),
    ] {
        assert!(
            last.with_label(name, label) > 0.0,
            "{name} has no sample with {label}:\n{}",
            last.samples.join("\n")
        );
    }
    assert!(
        last.samples.iter().all(|s| s.contains("backend=\"redis\"")),
        "every sample is labelled with its backend"
    );
    assert!(
        last.samples.iter().all(|s| !s.contains("key=\"")),
        "keys are not labels unless asked for"
    );
    // Everything the example exports is documented.
    let docs = documented();
    for name in last.totals.keys() {
        assert!(
            docs.contains(name),
            "{name} is exported but not in docs/metrics.md"
        );
    }
}
