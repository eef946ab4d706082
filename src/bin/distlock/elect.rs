//! `distlock elect` (run a command while this process leads an election) and
//! `distlock leader` (who leads, once or as it changes).

use std::time::Duration;

use distlock::election::Leader;
use distlock::LockClient;
use tokio::signal::unix::{signal, SignalKind};

use crate::exec::{parse_duration, ExecArgs};
use crate::{codes, format_ttl, Failure};

#[derive(Debug, clap::Args)]
pub struct ElectArgs {
    /// The value this process publishes while it leads (an address, a node name), shown
    /// by `distlock leader` (default: host/pid).
    #[arg(long)]
    value: Option<String>,

    /// The leader's lease; renewed every TTL/3 while the command runs. A leader that dies
    /// is succeeded at most this long after its last renewal.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,

    /// Give up after waiting this long to lead (exit code 75). Default: wait as long as it
    /// takes.
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,

    /// If renewals fail, send SIGTERM this long before the lease ends, and SIGKILL before
    /// it ends. Default: a third of the TTL, at most 10s; must be under half the TTL.
    #[arg(long, value_parser = parse_duration)]
    kill_after: Option<Duration>,

    /// Exit code when --wait runs out.
    #[arg(long, default_value_t = codes::CONFLICT)]
    conflict_exit_code: u8,

    /// The election's name.
    key: String,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    command: Vec<String>,
}

impl From<ElectArgs> for ExecArgs {
    fn from(a: ElectArgs) -> Self {
        ExecArgs {
            ttl: a.ttl,
            wait: a.wait,
            kill_after: a.kill_after,
            conflict_exit_code: a.conflict_exit_code,
            label: None,
            shared: false,
            limit: None,
            keys: vec![a.key],
            command: a.command,
            election: Some(a.value.unwrap_or_else(distlock::driver::default_label)),
        }
    }
}

/// `distlock elect`: `exec` with a campaign instead of a lock.
pub async fn run(args: ElectArgs, url: &str, quiet: bool, verbose: bool) -> Result<u8, Failure> {
    crate::exec::run(args.into(), url, quiet, verbose).await
}

/// `distlock leader KEY [--watch] [--json]`.
pub async fn leader(
    client: &LockClient,
    key: &str,
    watch: bool,
    json: bool,
) -> Result<u8, Failure> {
    let election = client.election(key);
    let looked_up = |e| Failure::from_lock_error(&e, "cannot look the leader up");
    if !watch {
        let now = election.leader().await.map_err(looked_up)?;
        println!("{}", show(key, now.as_ref(), json));
        return Ok(0);
    }
    let mut changes = election.observe().map_err(looked_up)?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| Failure::new(codes::SOFTWARE, e.to_string()))?;
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| Failure::new(codes::SOFTWARE, e.to_string()))?;
    loop {
        tokio::select! {
            change = changes.changed() => {
                let now = change.map_err(looked_up)?;
                println!("{}", show(key, now.as_ref(), json));
            }
            _ = interrupt.recv() => return Ok(0),
            _ = terminate.recv() => return Ok(0),
        }
    }
}

/// One line: "KEY: led by VALUE (term T, lease 12.0s)", "KEY: no leader", or JSON.
fn show(key: &str, leader: Option<&Leader>, json: bool) -> String {
    if json {
        let leader = leader.map(|l| {
            serde_json::json!({
                "value": l.value,
                "term": l.term.get(),
                "remaining_ttl_ms": l.remaining_ttl.map(|d| d.as_millis() as u64),
            })
        });
        return serde_json::json!({ "key": key, "leader": leader }).to_string();
    }
    match leader {
        Some(l) => format!(
            "{key}: led by {} (term {}, lease {})",
            l.value,
            l.term,
            format_ttl(l.remaining_ttl)
        ),
        None => format!("{key}: no leader"),
    }
}
