//! Reading a Redlock holder's token back: between the grants and the fencing write-back
//! each instance's copy carries its own token, so neither an inspect nor a renewal may
//! report one of those as the holder's. Leader election observers rely on it: a term they
//! report must be the leader's.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::RedlockHarness;
use driver_redis::redis::AsyncCommands;
use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt};
use lockcore::{LockBackend, LockClient, LockKey, Owner};

#[tokio::test(flavor = "multi_thread")]
async fn inspect_reports_only_the_holders_token() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = RedlockHarness::new(3);
        let holder = LockClient::new(h.builder().build().await.unwrap());
        let watcher = LockClient::new(h.builder().build().await.unwrap());
        let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let looking = {
            let (watcher, seen, stop) = (watcher.clone(), seen.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(info) = watcher.inspect("inspected").await.unwrap() {
                        seen.lock().unwrap().push((info.holder, info.token.0));
                    }
                }
            })
        };
        let mut tokens = HashMap::new();
        for i in 0..100 {
            let label = format!("holder-{i}");
            let guard = holder
                .lock("inspected")
                .owner(Owner::new(&label))
                .acquire()
                .await
                .unwrap();
            tokens.insert(label, guard.token().0);
            tokio::time::sleep(Duration::from_millis(2)).await;
            guard.release().await.unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        looking.await.unwrap();
        let seen = seen.lock().unwrap();
        let wrong: Vec<_> = seen
            .iter()
            .filter(|(label, token)| tokens.get(label) != Some(token))
            .collect();
        assert!(seen.len() > 20, "only {} looks saw a holder", seen.len());
        assert!(
            wrong.is_empty(),
            "{} of {} looks reported a token the holder does not have, e.g. {:?}",
            wrong.len(),
            seen.len(),
            &wrong[..wrong.len().min(3)]
        );
    })
    .await
    .unwrap();
}

/// A renewal answers the holder's token T, the one on the written-back copies (`0T`), even
/// when most renewing instances still hold copies not written back that agree on another.
#[tokio::test(flavor = "multi_thread")]
async fn extend_answers_the_written_back_token() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        let (k, o) = (LockKey::new("extended").unwrap(), Owner::new("o"));
        let ttl = Duration::from_secs(10);
        let AcquireOutcome::Acquired(grant) = b.try_acquire(&k, &o, ttl).await.unwrap() else {
            panic!("a fresh key was held");
        };
        let lock = driver_redis::__redlock::names(&h.prefix, &k).lock;
        let stale = format!("{} 5 o", o.token().to_hex());
        let settled = format!("{} 0{} o", o.token().to_hex(), grant.token.0);
        for (i, url) in h.urls.iter().enumerate() {
            let client = driver_redis::redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            match i {
                // Copies as their instances granted them (token 5, not written back), and
                // the written-back copy. Instance 2's is set too: had it granted after the
                // majority, its own token would be above T and stay unmarked.
                0..=2 => {
                    let _: () = driver_redis::redis::cmd("SET")
                        .arg(&lock)
                        .arg(if i == 2 { &settled } else { &stale })
                        .arg("KEEPTTL")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                // No copy: these answer that the owner does not hold it.
                _ => {
                    let _: () = conn.del(&lock).await.unwrap();
                }
            }
        }
        match b.extend(&k, &o, ttl).await.unwrap() {
            ExtendOutcome::Extended(renewed) => assert_eq!(renewed.token, grant.token),
            ExtendOutcome::NotHeld => panic!("three copies of five did not renew"),
        }
    })
    .await
    .unwrap();
}

/// A copy as each instance holds it, read and rewritten straight on the instance: the lock
/// value of an exclusive hold, or the lease's data of a shared one.
struct Copies {
    conns: Vec<driver_redis::redis::aio::MultiplexedConnection>,
    names: driver_redis::__redlock::Names,
    field: String,
    shared: bool,
}

impl Copies {
    async fn of(h: &RedlockHarness, k: &LockKey, o: &Owner, shared: bool) -> Copies {
        let mut conns = Vec::new();
        for url in &h.urls {
            let client = driver_redis::redis::Client::open(url.as_str()).unwrap();
            conns.push(client.get_multiplexed_async_connection().await.unwrap());
        }
        Copies {
            conns,
            names: driver_redis::__redlock::names(&h.prefix, k),
            field: format!("l:{}", o.token().to_hex()),
            shared,
        }
    }

    /// Instance `i`'s copy: its token as stored (`0T` once written back), or `None`.
    async fn token(&mut self, i: usize) -> Option<String> {
        let conn = &mut self.conns[i];
        if self.shared {
            let data: Option<String> = conn.hget(self.names.claims(), &self.field).await.unwrap();
            data.map(|d| d.split(' ').nth(1).unwrap().to_string())
        } else {
            let value: Option<String> = conn.get(&self.names.lock).await.unwrap();
            value.map(|v| v[33..].split(' ').next().unwrap().to_string())
        }
    }

    /// Instance `i`'s copy given `token` as stored, keeping the rest of it and its expiry.
    async fn set_token(&mut self, i: usize, token: &str) {
        let conn = &mut self.conns[i];
        if self.shared {
            let data: String = conn.hget(self.names.claims(), &self.field).await.unwrap();
            let mut parts: Vec<&str> = data.splitn(3, ' ').collect();
            parts[1] = token;
            let _: () = conn
                .hset(self.names.claims(), &self.field, parts.join(" "))
                .await
                .unwrap();
        } else {
            let value: String = conn.get(&self.names.lock).await.unwrap();
            let label = value[33..].split_once(' ').map_or("", |(_, l)| l);
            let _: () = driver_redis::redis::cmd("SET")
                .arg(&self.names.lock)
                .arg(format!("{}{token} {label}", &value[..33]))
                .arg("KEEPTTL")
                .query_async(conn)
                .await
                .unwrap();
        }
    }

    /// Instance `i`'s copy of an exclusive hold given `ms` milliseconds to live.
    async fn expire(&mut self, i: usize, ms: i64) {
        let _: () = self.conns[i].pexpire(&self.names.lock, ms).await.unwrap();
    }

    /// Instance `i` without the copy.
    async fn remove(&mut self, i: usize) {
        let conn = &mut self.conns[i];
        if self.shared {
            let owner = &self.field[2..];
            let _: () = conn.zrem(self.names.leases(), owner).await.unwrap();
            let _: () = conn.hdel(self.names.claims(), &self.field).await.unwrap();
        } else {
            let _: () = conn.del(&self.names.lock).await.unwrap();
        }
    }
}

/// A hold of `claim` on `key` by a fresh owner on three instances, its token, and its
/// copies with every copy written back; then instance 2's copy as one granted after the
/// majority, not written back yet: its own token, above the holder's.
async fn hold_with_a_late_copy(
    h: &RedlockHarness,
    b: &dyn LockBackend,
    key: &str,
    claim: lockcore::Claim,
) -> (LockKey, Owner, u64, Copies) {
    let (k, o) = (LockKey::new(key).unwrap(), Owner::new("o"));
    let AcquireOutcome::Acquired(grant) = b
        .try_claim(&k, &o, Duration::from_secs(10), claim)
        .await
        .unwrap()
    else {
        panic!("a fresh key was held");
    };
    let t = grant.token.0;
    let mut copies = Copies::of(h, &k, &o, !claim.is_exclusive()).await;
    for i in 0..2 {
        copies.set_token(i, &format!("0{t}")).await;
    }
    copies.set_token(2, &(t + 1000).to_string()).await;
    (k, o, t, copies)
}

/// The tokens `inspect_all` lists for `k`.
async fn tokens_listed(watcher: &LockClient, k: &LockKey) -> Vec<u64> {
    let all = watcher.inspect_all(k.as_str()).await.unwrap();
    all.iter().map(|l| l.token.0).collect()
}

/// A same-owner re-grant keeps the holder's token T when a majority of its copies carry T
/// written back, even though a copy granted late (not written back yet) carries its own,
/// higher token; the write-back of T leaves that copy's higher token alone. Exclusive and
/// shared holds alike.
#[tokio::test(flavor = "multi_thread")]
async fn a_re_grant_keeps_the_token_its_written_back_copies_carry() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = RedlockHarness::new(3);
        let b = h.builder().build().await.unwrap();
        for claim in [lockcore::Claim::exclusive(), lockcore::Claim::shared()] {
            let (k, o, t, mut copies) = hold_with_a_late_copy(&h, &*b, "regranted", claim).await;
            // Several times: which two instances answer first varies.
            for round in 0..6 {
                let again = b
                    .try_claim(&k, &o, Duration::from_secs(10), claim)
                    .await
                    .unwrap();
                let AcquireOutcome::Acquired(grant) = again else {
                    panic!("{claim}: the holder asking again was refused");
                };
                assert_eq!(grant.token.0, t, "{claim}, re-grant {round}");
                assert_eq!(
                    copies.token(2).await.as_deref(),
                    Some((t + 1000).to_string().as_str()),
                    "{claim}: the write-back lowered the late copy's token"
                );
            }
            let watcher = LockClient::new(h.builder().build().await.unwrap());
            assert_eq!(tokens_listed(&watcher, &k).await, vec![t], "{claim}");
            b.release(&k, &o).await.unwrap();
        }
    })
    .await
    .unwrap();
}

/// `inspect_all` reports the written-back token even when only two copies of three are
/// there, one written back and one not (a tie the higher, unsettled token used to win).
#[tokio::test(flavor = "multi_thread")]
async fn inspect_all_prefers_the_written_back_copy() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = RedlockHarness::new(3);
        let b = h.builder().build().await.unwrap();
        let watcher = LockClient::new(h.builder().build().await.unwrap());
        for claim in [lockcore::Claim::exclusive(), lockcore::Claim::shared()] {
            let (k, o, t, mut copies) = hold_with_a_late_copy(&h, &*b, "tied", claim).await;
            copies.remove(0).await;
            assert_eq!(tokens_listed(&watcher, &k).await, vec![t], "{claim}");
            b.release(&k, &o).await.unwrap();
        }
    })
    .await
    .unwrap();
}

/// `inspect` reports how long a majority keeps the lease, not how long the first majority
/// to answer does: with the copies on instances 0 and 1 (the first asked, so usually among
/// the first to answer) about to expire and the other three long, the lease lasts as long
/// as those three. A same-owner re-grant with a shorter TTL leaves such short copies where
/// the first grant never reached.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_reports_how_long_a_majority_keeps_the_lease() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        let (k, o) = (LockKey::new("kept-by-a-majority").unwrap(), Owner::new("o"));
        let long = Duration::from_secs(20);
        let AcquireOutcome::Acquired(_) = b.try_acquire(&k, &o, long).await.unwrap() else {
            panic!("a fresh key was held");
        };
        let mut copies = Copies::of(&h, &k, &o, false).await;
        for i in 0..2 {
            copies.expire(i, 3_000).await;
        }
        let watcher = LockClient::new(h.builder().build().await.unwrap());
        for look in 0..10 {
            let info = watcher.inspect(k.as_str()).await.unwrap().expect("held");
            let left = info.remaining_ttl.expect("a remaining TTL");
            assert!(
                left > Duration::from_secs(10) && left <= long,
                "look {look}: inspect reported {left:?} left, the short copies' time"
            );
        }
        b.release(&k, &o).await.unwrap();
    })
    .await
    .unwrap();
}
