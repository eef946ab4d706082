//! The queue on the real etcd, one member (`DISTLOCK_TEST_ETCD_URL`) and the three-member
//! cluster (`DISTLOCK_TEST_ETCD_CLUSTER_URL`): queue order, a waiter whose lease is revoked
//! while queued, abandoned places, and `etcdctl lock` on the same name.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{random_namespace, url_from_env, TTL};
use distlock_etcd::etcd_client::{
    Client, GetOptions, KeyValue, SortOrder, SortTarget, WatchOptions,
};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{FencingToken, LockBackend, LockClient, LockError, LockKey};

/// A configuration for the servers in `var` under a fresh namespace.
fn config(var: &str) -> EtcdConfig {
    EtcdConfig::parse(&url_from_env(var))
        .unwrap()
        .with_namespace(&random_namespace())
        .unwrap()
}

/// A plain etcd client on the same servers, to look at (and tamper with) the queue.
async fn raw(cfg: &EtcdConfig) -> Client {
    Client::connect(cfg.endpoints.clone(), None).await.unwrap()
}

/// The etcd key prefix of `key`'s queue.
fn prefix(cfg: &EtcdConfig, key: &str) -> Vec<u8> {
    EtcdBackend::new(cfg.clone())
        .unwrap()
        .etcd_key(&LockKey::new(key).unwrap())
}

/// Waits (on a watch, not by polling) until the queue under `prefix` satisfies `ok`, and
/// returns it in queue order.
async fn wait_queue(
    raw: &mut Client,
    prefix: &[u8],
    what: &str,
    ok: impl Fn(&[KeyValue]) -> bool,
) -> Vec<KeyValue> {
    let in_order = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let r = raw.get(prefix, Some(in_order.clone())).await.unwrap();
            let kvs = r.kvs().to_vec();
            if ok(&kvs) {
                return kvs;
            }
            let rev = r.header().unwrap().revision();
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(rev + 1);
            let mut w = raw.watch(prefix, Some(opts)).await.unwrap();
            while let Some(m) = w.message().await.unwrap() {
                if !m.events().is_empty() || m.canceled() {
                    break;
                }
            }
        }
    })
    .await;
    match r {
        Ok(kvs) => kvs,
        Err(_) => panic!("the queue never {what}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `body` on a fresh runtime within `limit`.
fn bounded<F: std::future::Future<Output = ()>>(limit: Duration, body: F) {
    runtime().block_on(async {
        tokio::time::timeout(limit, body).await.expect("timed out");
    });
}

/// A task in which `client` waits for `"k"` (30 s at most), runs `then` holding it, and
/// releases it.
fn served(client: LockClient, then: impl FnOnce() + Send + 'static) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let g = client
            .lock("k")
            .ttl(TTL)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        then();
        g.release().await.unwrap();
    })
}

/// Queues `n` waiters (each a client of its own, as separate processes would be) one after
/// the other behind a holder, releases, and returns the order in which they were served.
/// Each waiter is started once the previous one's place is in the queue.
async fn service_order(var: &str, n: usize) -> Vec<usize> {
    let cfg = config(var);
    let mut raw = raw(&cfg).await;
    let prefix = prefix(&cfg, "k");
    let holder = LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
    let held = holder.lock("k").ttl(TTL).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let client = LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
        let order = order.clone();
        tasks.push(served(client, move || order.lock().unwrap().push(i)));
        wait_queue(&mut raw, &prefix, "grew", |q| q.len() == i + 2).await;
    }
    held.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

/// Waiters are served in exactly the order they queued.
fn served_in_queue_order(var: &str) {
    bounded(Duration::from_secs(60), async {
        let n = 6;
        let order = service_order(var, n).await;
        assert_eq!(
            order,
            (0..n).collect::<Vec<_>>(),
            "served out of queue order"
        );
    });
}

/// A queued waiter whose lease is revoked loses its place: it is never told "acquired"
/// while the holder holds, it queues again at the back (behind a waiter that queued after
/// it), and its token is that of its new place. With `release_at_once`, the holder releases
/// right after the revoke, before the waiter can notice its lease is gone: the deletion of
/// its predecessor then wakes a waiter whose place no longer exists (the case Jepsen found
/// etcd's own lock granting in 2020).
fn revoked_waiter(var: &str, release_at_once: bool) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let mut raw = raw(&cfg).await;
        let prefix = prefix(&cfg, "k");
        let client = || LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
        let holder = client();
        let held = holder.lock("k").ttl(TTL).acquire().await.unwrap();
        let held_token = held.token();
        let order = Arc::new(Mutex::new(Vec::new()));
        // Overlap detector: a second holder while one holds fails the test.
        let busy = Arc::new(AtomicBool::new(false));
        let waiter = |name: &'static str| {
            let c = client();
            let order = order.clone();
            let busy = busy.clone();
            tokio::spawn(async move {
                let g = c
                    .lock("k")
                    .ttl(TTL)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                assert!(!busy.swap(true, Ordering::SeqCst), "two holders at once");
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(200)).await;
                busy.store(false, Ordering::SeqCst);
                let token = g.token();
                g.release().await.unwrap();
                token
            })
        };
        let w = waiter("w");
        let queue = wait_queue(&mut raw, &prefix, "held w", |q| q.len() == 2).await;
        let w_key = queue[1].key().to_vec();
        let w_first_rev = queue[1].create_revision();
        let c = waiter("c");
        wait_queue(&mut raw, &prefix, "held c", |q| q.len() == 3).await;

        raw.lease_revoke(queue[1].lease()).await.unwrap();
        if release_at_once {
            held.release().await.unwrap();
        } else {
            // W notices (its lease refresh fails, within TTL/3) and queues again, behind C.
            let queue = wait_queue(&mut raw, &prefix, "took w back", |q| {
                q.len() == 3 && q[2].key() == w_key.as_slice()
            })
            .await;
            assert!(queue[2].create_revision() > w_first_rev);
            // Past a whole TTL of W's first lease: nothing was granted meanwhile.
            tokio::time::sleep(TTL).await;
            assert!(
                order.lock().unwrap().is_empty(),
                "granted while the holder holds"
            );
            assert!(!w.is_finished() && !c.is_finished());
            let info = holder.inspect("k").await.unwrap().unwrap();
            assert_eq!(info.token, held_token, "the holder lost the lock");
            held.release().await.unwrap();
        }

        let c_token = c.await.unwrap();
        let w_token = w.await.unwrap();
        assert_eq!(
            *order.lock().unwrap(),
            ["c", "w"],
            "the revoked waiter kept its place"
        );
        assert!(w_token > c_token && c_token > held_token);
        assert_ne!(w_token, FencingToken(w_first_rev as u64));
    });
}

fn revoked_waiter_requeues(var: &str) {
    revoked_waiter(var, false);
}

fn revoked_waiter_woken_by_release(var: &str) {
    revoked_waiter(var, true);
}

/// A waiter that gives up (deadline, or try_acquire answered "held") leaves no place
/// behind: the next waiter, queued behind it, is served at once when the holder releases,
/// not when the abandoned place's (long) lease runs out.
fn abandoned_place_is_removed(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let mut raw = raw(&cfg).await;
        let prefix = prefix(&cfg, "k");
        let client = || LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
        let long = Duration::from_secs(60);
        let holder = client();
        let held = holder.lock("k").ttl(TTL).acquire().await.unwrap();

        let impatient = client();
        let gives_up = tokio::spawn(async move {
            impatient
                .lock("k")
                .ttl(long)
                .wait(Duration::from_millis(1500))
                .acquire()
                .await
        });
        let q = wait_queue(&mut raw, &prefix, "held the impatient waiter", |q| {
            q.len() == 2
        })
        .await;
        let impatient_key = q[1].key().to_vec();
        let patient = client();
        let next = tokio::spawn(async move {
            let g = patient
                .lock("k")
                .ttl(TTL)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        });
        wait_queue(&mut raw, &prefix, "held the patient waiter", |q| {
            q.len() == 3
        })
        .await;

        let err = gives_up.await.unwrap().unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
        wait_queue(&mut raw, &prefix, "dropped the abandoned place", |q| {
            q.len() == 2 && q.iter().all(|kv| kv.key() != impatient_key.as_slice())
        })
        .await;

        // try_acquire answered "held": its place goes too.
        let prober = client();
        assert!(prober
            .lock("k")
            .ttl(long)
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        wait_queue(&mut raw, &prefix, "dropped the prober's place", |q| {
            q.len() == 2
        })
        .await;

        let released = Instant::now();
        held.release().await.unwrap();
        let served = next.await.unwrap();
        assert!(
            served.duration_since(released) < Duration::from_secs(2),
            "the next waiter waited {:?} after the release",
            served.duration_since(released)
        );
    });
}

/// `etcdctl lock` (Go's `concurrency.Mutex`, the recipe whose layout this driver uses) and
/// distlock on the same lock exclude each other: etcdctl queues behind a distlock holder
/// and gets the lock at its release; distlock then waits for etcdctl's release.
fn etcdctl_lock_and_distlock_exclude_each_other(var: &str) {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, BufReader};
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let prefix = prefix(&cfg, "k");
        // etcdctl's lock name is the prefix of its queue without the `/` it appends.
        let name = String::from_utf8(prefix[..prefix.len() - 1].to_vec()).unwrap();
        let locks = LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
        let held = locks.lock("k").ttl(TTL).acquire().await.unwrap();
        let mut raw = raw(&cfg).await;
        let mut etcdctl = tokio::process::Command::new("etcdctl")
            .arg(format!("--endpoints={}", cfg.endpoints.join(",")))
            .args(["lock", "--ttl=5", &name])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl (Debian package etcd-client) runs");
        let queue = wait_queue(&mut raw, &prefix, "etcdctl queued", |q| q.len() == 2).await;
        assert!(queue[1].value().is_empty(), "etcdctl's place has a value");
        let mut lines = BufReader::new(etcdctl.stdout.take().unwrap()).lines();
        // etcdctl prints its key once it holds the lock: not while distlock holds it.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), lines.next_line())
                .await
                .is_err(),
            "etcdctl took a lock distlock holds"
        );
        held.release().await.unwrap();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("etcdctl never got the lock distlock released")
            .unwrap()
            .unwrap();
        assert!(
            line.as_bytes().starts_with(&prefix),
            "etcdctl printed {line:?}"
        );
        assert!(
            locks
                .lock("k")
                .ttl(TTL)
                .try_acquire()
                .await
                .unwrap()
                .is_none(),
            "distlock took a lock etcdctl holds"
        );
        let holder = locks
            .inspect("k")
            .await
            .unwrap()
            .expect("etcdctl's holder shows");
        assert_eq!(
            holder.holder,
            "<etcd lock: etcdctl lock or concurrency.Mutex>"
        );
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let g = locks
                    .lock("k")
                    .ttl(TTL)
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                let at = Instant::now();
                g.release().await.unwrap();
                at
            })
        };
        wait_queue(&mut raw, &prefix, "distlock queued", |q| q.len() == 2).await;
        // etcdctl unlocks and exits on SIGTERM.
        let pid = etcdctl.id().unwrap().to_string();
        let stopped = Instant::now();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
        etcdctl.wait().await.unwrap();
        let granted = waiter.await.unwrap();
        assert!(
            granted.duration_since(stopped) < Duration::from_secs(4),
            "distlock waited {:?} after etcdctl's release",
            granted.duration_since(stopped)
        );
    });
}

/// The gauges of an etcd member's `/metrics` named `names`, in that order.
async fn gauges(addr: std::net::SocketAddr, names: [&str; 2]) -> [i64; 2] {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    names.map(|name| {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics")) as i64
    })
}

/// A backend's waiters in one queue share one watch of it, kept open while they come and
/// go: a watch opened per wait started, about once in a thousand hand-offs, behind the
/// store's revision ("unsynced"), and its waiter learned of the release up to 100 ms
/// late. On a member of its own, so the member's watcher gauges count only ours.
#[test]
fn waiters_in_one_queue_share_one_watch() {
    bounded(Duration::from_secs(60), async {
        let dir = common::TempDir::new("etcd-watchers");
        let mut member = common::members(1, &dir).pop().unwrap();
        member.start().await.unwrap();
        let cfg = EtcdConfig::new([format!("127.0.0.1:{}", member.client_port)])
            .with_namespace(&random_namespace())
            .unwrap();
        common::wait_ready(&cfg, Duration::from_secs(10))
            .await
            .unwrap();
        let names = [
            "etcd_debugging_mvcc_watcher_total",
            "etcd_debugging_mvcc_watch_stream_total",
        ];
        let holder = LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
        let held = holder.lock("k").ttl(TTL).acquire().await.unwrap();
        let mut raw = raw(&cfg).await;
        let prefix = prefix(&cfg, "k");
        // Four waiters, each a client of its own (its own line) over one backend.
        let backend = EtcdBackend::new(cfg.clone()).unwrap();
        let n = 4;
        let mut tasks = Vec::new();
        for _ in 0..n {
            tasks.push(served(LockClient::new(backend.clone()), || {}));
        }
        // Looked at by polling: a watch of ours would count in the gauges.
        let counted = GetOptions::new().with_prefix().with_count_only();
        let started = Instant::now();
        while raw
            .get(prefix.clone(), Some(counted.clone()))
            .await
            .unwrap()
            .count()
            < n as i64 + 1
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the queue never filled"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Each waiter listens once its place is queued: the count reaches one watch and
        // stays there, whereas a watch per waiter reaches four.
        let mut most = [0; 2];
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(600) {
            let now = gauges(member.client_addr(), names).await;
            most = [most[0].max(now[0]), most[1].max(now[1])];
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(most, [1, 1], "{names:?} while {n} waiters wait");
        held.release().await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        // Passed from waiter to waiter on the same watch; still one.
        let now = gauges(member.client_addr(), names).await;
        assert!(
            now[0] <= 1 && now[1] <= 1,
            "{names:?} after the hand-offs: {now:?}"
        );
        drop(raw);
        backend.shutdown().await;
        member.kill();
    });
}

on_both!(
    served_in_queue_order,
    revoked_waiter_requeues,
    revoked_waiter_woken_by_release,
    abandoned_place_is_removed,
    etcdctl_lock_and_distlock_exclude_each_other,
);
