//! `distlock status`, and the line `exec` prints about a lock it could not take: every
//! holder of a key with its mode, permits and fencing token.

use distlock::{ClaimMode, ErrorChain, LockClient, LockInfo};

use crate::{format_ttl, Failure};

/// How much [`holder_line`] says.
#[derive(Clone, Copy)]
pub enum Form {
    /// To follow "KEY is ": the holder with its fencing token, and when it frees at the latest.
    Full,
    /// For the spinner's one row (80 columns hold it for a key and a label of ordinary
    /// length): the holder and its lease's remaining TTL; no token.
    Brief,
}

/// Who holds `key`, in the given form. `held`: an attempt just found it held (otherwise
/// the wait may be retrying a store that does not answer, and a failed look-up says so).
pub async fn holder_line(client: &LockClient, key: &str, held: bool, form: Form) -> String {
    match client.inspect_all(key).await {
        // Nobody holds it, yet an attempt was refused: its next turn is kept for a waiter
        // that came first (a mark for a long wait, a reservation for a writer or a larger
        // claim), or it was released just now.
        Ok(all) if all.is_empty() => match (form, unlisted_holds(client)) {
            (Form::Full, None) => "free, but its next turn is kept for a process that waits \
                                   for it (or it was released just now)"
                .into(),
            (Form::Full, Some(store)) => format!(
                "free as far as {store} lists, but a transaction may hold it ({store} does not \
                 list those), or its next turn is kept for a process that waits for it (or it \
                 was released just now)"
            ),
            (Form::Brief, None) => "free, next turn kept for another waiter".into(),
            (Form::Brief, Some(_)) => "no holder listed (a transaction, or a waiter's turn)".into(),
        },
        Ok(all) => summary(&all, form),
        Err(e) if held => format!(
            "held (its holder could not be looked up: {})",
            ErrorChain(&e)
        ),
        Err(e) => format!("not known whether it is held ({})", ErrorChain(&e)),
    }
}

/// The store's name when it holds locks inside SQL transactions that `holders` cannot list
/// (MySQL and SQLite, see docs/sql.md): a key refused with no holder listed may be one.
pub fn unlisted_holds(client: &LockClient) -> Option<&'static str> {
    Some(client.backend().name()).filter(|name| matches!(*name, "mysql" | "sqlite"))
}

/// For a set being waited for: the first of `keys` (in the order a set takes them) that a
/// holder other than `own` (this process's label: the keys it took on its way to the rest
/// are its own) holds, with its holders in `form`. If none is, the first key and its line.
pub async fn set_holder_line(
    client: &LockClient,
    keys: &[String],
    own: &str,
    form: Form,
) -> (String, String) {
    let mut ordered: Vec<&String> = keys.iter().collect();
    ordered.sort_unstable();
    for key in &ordered {
        match client.inspect_all(key).await {
            Ok(all) => {
                let others: Vec<LockInfo> = all.into_iter().filter(|i| i.holder != own).collect();
                if !others.is_empty() {
                    return ((*key).clone(), summary(&others, form));
                }
            }
            Err(e) => {
                let line = format!("not known whether it is held ({})", ErrorChain(&e));
                return ((*key).clone(), line);
            }
        }
    }
    let first = ordered.first().map_or_else(String::new, |k| (*k).clone());
    let line = holder_line(client, &first, false, form).await;
    (first, line)
}

/// `KEY is HOLDERS` (the full form) for each of `keys` held now, in order; keys that are
/// free or cannot be looked up are left out.
pub async fn held_lines(client: &LockClient, keys: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    for key in keys {
        if let Ok(all) = client.inspect_all(key).await {
            if !all.is_empty() {
                lines.push(format!("{key} is {}", summary(&all, Form::Full)));
            }
        }
    }
    lines
}

/// The holders on one short line, in `form`: the exclusive holder, or how many share the
/// key and when room comes at the latest. The brief form (the spinner's) names a lease's
/// remaining TTL as such: a holder that renews keeps it longer.
fn summary(all: &[LockInfo], form: Form) -> String {
    let Some(first) = all.first() else {
        return "free".into();
    };
    let last = format_ttl(all.iter().filter_map(|i| i.remaining_ttl).max());
    let soonest = format_ttl(all.iter().filter_map(|i| i.remaining_ttl).min());
    let readers = all.len();
    let s = plural(readers as u64);
    let used: u64 = all.iter().map(|i| i.claim.weight()).sum();
    let capacity = first.claim.capacity();
    match (first.claim.mode(), form) {
        (ClaimMode::Exclusive, Form::Full) => format!("held by {}", lease(first)),
        (ClaimMode::Exclusive, Form::Brief) => match first.remaining_ttl {
            Some(left) => format!(
                "held by {}, lease {} left",
                first.holder,
                format_ttl(Some(left))
            ),
            None => format!("held by {}, no expiry known", first.holder),
        },
        (ClaimMode::Shared, Form::Full) => {
            format!("shared by {readers} reader{s} (all gone in at most {last})")
        }
        (ClaimMode::Shared, Form::Brief) => {
            format!("shared by {readers} reader{s}, longest lease {last} left")
        }
        (_, Form::Full) => format!(
            "a semaphore with {used} of {capacity} permits in use (the next back in at most {soonest})"
        ),
        (_, Form::Brief) => {
            format!("{used} of {capacity} permits in use, shortest lease {soonest} left")
        }
    }
}

/// One lease: "host/pid (fencing token 7, free in at most 12.0s)"; a hold the store tells
/// no expiry of (a SQL transaction's, kept until it ends): "(transaction) (fencing token 7,
/// no expiry known)".
fn lease(i: &LockInfo) -> String {
    match i.remaining_ttl {
        Some(left) => format!(
            "{} (fencing token {}, free in at most {})",
            i.holder,
            i.token,
            format_ttl(Some(left))
        ),
        None => format!("{} (fencing token {}, no expiry known)", i.holder, i.token),
    }
}

/// The holders of a held key, in grant order: one line for an exclusive holder, a heading
/// and a line per holder for readers and semaphores.
fn describe(all: &[LockInfo]) -> String {
    let Some(first) = all.first() else {
        return "free".into();
    };
    match first.claim.mode() {
        ClaimMode::Exclusive => format!("held by {}", lease(first)),
        ClaimMode::Shared => {
            let mut text = format!(
                "shared by {} reader{}:",
                all.len(),
                plural(all.len() as u64)
            );
            for i in all {
                text.push_str(&format!("\n  {}", lease(i)));
            }
            text
        }
        _ => {
            let used: u64 = all.iter().map(|i| i.claim.weight()).sum();
            let mut text = format!(
                "a semaphore with {used} of {} permits in use:",
                first.claim.capacity()
            );
            for i in all {
                let k = i.claim.weight();
                text.push_str(&format!("\n  {k} permit{} held by {}", plural(k), lease(i)));
            }
            text
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `distlock status [--json] KEY...`: who holds each key, and in which `store` (shown
/// redacted); exits with the conflict code if any of them is held.
pub async fn run(
    client: &LockClient,
    keys: &[String],
    json: bool,
    store: &str,
) -> Result<u8, Failure> {
    let mut any_held = false;
    for key in keys {
        let all = client
            .inspect_all(key)
            .await
            .map_err(|e| Failure::from_lock_error(&e, "cannot look the lock up"))?;
        any_held |= !all.is_empty();
        if json {
            // One object per line, one line per key.
            let mut value = to_json(key, &all);
            value["store"] = store.into();
            println!("{value}");
        } else if all.is_empty() {
            println!("{key}: free");
        } else {
            // An exclusive holder keeps the one-line form scripts already read.
            let text = describe(&all).replacen("free in at most", "remaining TTL", usize::MAX);
            println!("{key}: {text}");
        }
    }
    if !json {
        // A mistyped path or URL is another store, where every key is free.
        println!("store: {store}");
    }
    // As `flock -n` and `pg_isready` answer: a script can test the keys without parsing.
    Ok(if any_held { crate::codes::CONFLICT } else { 0 })
}

/// The JSON form: the newest holder at the top level (as for an exclusive lock), every
/// holder under `holders`, and the permits in use for a semaphore.
fn to_json(key: &str, all: &[LockInfo]) -> serde_json::Value {
    let ms = |i: &LockInfo| i.remaining_ttl.map(|d| d.as_millis() as u64);
    let Some(newest) = all.last() else {
        return serde_json::json!({ "key": key, "held": false, "holders": [] });
    };
    let holders: Vec<_> = all
        .iter()
        .map(|i| {
            let mut h = serde_json::json!({
                "holder": i.holder, "fencing_token": i.token.get(),
                "remaining_ttl_ms": ms(i), "mode": i.claim.mode(),
            });
            if let Some(p) = i.claim.semaphore_permits() {
                h["permits"] = p.into();
            }
            h
        })
        .collect();
    let mut value = serde_json::json!({
        "key": key, "held": true, "mode": newest.claim.mode(), "holder": newest.holder,
        "fencing_token": newest.token.get(), "remaining_ttl_ms": ms(newest), "holders": holders,
    });
    if newest.claim.mode() == ClaimMode::Permits {
        value["capacity"] = newest.claim.capacity().into();
        value["permits_in_use"] = all.iter().map(|i| i.claim.weight()).sum::<u64>().into();
    }
    value
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use distlock::{FencingToken, LockInfo};

    use super::{describe, summary, unlisted_holds, Form};

    /// A hold without an expiry (a SQL transaction's) is said so, in every form; a lease
    /// keeps its remaining TTL.
    #[test]
    fn a_hold_without_expiry_says_so() {
        let hold = [LockInfo::new("(transaction)", FencingToken(7), None)];
        assert_eq!(
            describe(&hold),
            "held by (transaction) (fencing token 7, no expiry known)"
        );
        assert_eq!(
            summary(&hold, Form::Brief),
            "held by (transaction), no expiry known"
        );
        let lease = [LockInfo::new(
            "host/1",
            FencingToken(8),
            Some(Duration::from_secs(12)),
        )];
        assert_eq!(
            describe(&lease),
            "held by host/1 (fencing token 8, free in at most 12.0s)"
        );
        assert_eq!(
            summary(&lease, Form::Brief),
            "held by host/1, lease 12.0s left"
        );
    }

    /// Only the stores whose transactions' holds `holders` cannot list say a transaction may
    /// hold a key refused with no holder listed.
    #[tokio::test]
    async fn only_mysql_and_sqlite_hide_transactions() {
        let memory = distlock::LockClient::new(distlock::memory::MemoryBackend::new());
        assert_eq!(unlisted_holds(&memory), None);
        let dir = std::env::temp_dir().join(format!("status-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite:{}", dir.join("locks.db").display());
        let sqlite = distlock::connect(&url).await.unwrap();
        assert_eq!(unlisted_holds(&sqlite), Some("sqlite"));
        sqlite.shutdown().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
