//! Batched renewals on a real etcd: batches larger than etcd's limit of operations per
//! transaction renew every hold, each hold's first batched renewal moves its key onto the
//! backend's shared lease for its TTL (token and value unchanged), and a hold's outcome is
//! its own.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{random_namespace, url_from_env};
use distlock_etcd::etcd_client::{Client, DeleteOptions, GetOptions};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt, Renewal};
use lockcore::{FencingToken, LockBackend, LockKey, Owner, ReleaseOutcome};

const TTL: Duration = Duration::from_secs(10);

/// The read of a lock's whole queue (its only place, here: each lock has one holder).
fn queue() -> Option<GetOptions> {
    Some(GetOptions::new().with_prefix())
}

/// More than one transaction's worth of operations (etcd allows 128).
const HOLDS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_the_txn_limit_renew_every_hold_on_one_shared_lease() {
    let cfg = EtcdConfig::parse(&url_from_env("DISTLOCK_TEST_ETCD_URL"))
        .unwrap()
        .with_namespace(&random_namespace())
        .unwrap();
    let backend = EtcdBackend::new(cfg.clone()).unwrap();
    assert!(backend.capabilities().batched_renewals);
    let mut raw = Client::connect(cfg.endpoints.clone(), None).await.unwrap();

    let mut held: Vec<(LockKey, Owner, FencingToken)> = Vec::new();
    for i in 0..HOLDS {
        let key = LockKey::new(format!("renew-{i}")).unwrap();
        let owner = Owner::new("holder");
        let AcquireOutcome::Acquired(g) = backend.try_acquire(&key, &owner, TTL).await.unwrap()
        else {
            panic!("free key {key} was not granted");
        };
        held.push((key, owner, g.token));
    }
    let lease_of = |kv: &distlock_etcd::etcd_client::KeyValue| kv.lease();
    let mut before = HashSet::new();
    for (key, _, _) in &held {
        let r = raw.get(backend.etcd_key(key), queue()).await.unwrap();
        before.insert(lease_of(&r.kvs()[0]));
    }
    assert_eq!(
        before.len(),
        HOLDS,
        "each hold starts on a lease of its own"
    );

    // One released hold and one stranger ride along; each answers for itself.
    let (gone_key, gone_owner, _) = held.pop().unwrap();
    assert_eq!(
        backend.release(&gone_key, &gone_owner).await.unwrap(),
        ReleaseOutcome::Released
    );
    let stranger = Owner::new("stranger");
    for round in ["moves each key", "only reads"] {
        let mut renewals: Vec<Renewal<'_>> = held
            .iter()
            .map(|(k, o, _)| Renewal::new(k, o, TTL))
            .collect();
        renewals.push(Renewal::new(&gone_key, &gone_owner, TTL));
        renewals.push(Renewal::new(&held[0].0, &stranger, TTL));
        let outcomes = backend.renew(&renewals).await.unwrap();
        assert_eq!(outcomes.len(), renewals.len());
        for ((key, _, token), outcome) in held.iter().zip(&outcomes) {
            match outcome {
                Ok(ExtendOutcome::Extended(g)) => assert_eq!(
                    g.token, *token,
                    "{key}: renewed with another token ({round})"
                ),
                other => panic!("{key}: {other:?} ({round})"),
            }
        }
        assert!(
            matches!(outcomes[HOLDS - 1], Ok(ExtendOutcome::NotHeld)),
            "a released hold was renewed ({round}): {:?}",
            outcomes[HOLDS - 1]
        );
        assert!(
            matches!(outcomes[HOLDS], Ok(ExtendOutcome::NotHeld)),
            "a stranger renewed another owner's hold ({round}): {:?}",
            outcomes[HOLDS]
        );
        let mut after = HashSet::new();
        for (key, _, token) in &held {
            let r = raw.get(backend.etcd_key(key), queue()).await.unwrap();
            let kv = &r.kvs()[0];
            assert_eq!(
                kv.create_revision() as u64,
                token.0,
                "{key}: a new incarnation"
            );
            after.insert(lease_of(kv));
        }
        assert_eq!(
            after.len(),
            1,
            "holds renewed together share one lease ({round})"
        );
        assert!(
            after.is_disjoint(&before),
            "still on a lease of its own ({round})"
        );
        let shared = *after.iter().next().unwrap();
        let ttl = raw.lease_time_to_live(shared, None).await.unwrap().ttl();
        assert!(
            ttl > 5,
            "the shared lease was not kept alive ({round}): {ttl} s left"
        );
    }
    assert!(
        raw.get(backend.etcd_key(&gone_key), queue())
            .await
            .unwrap()
            .kvs()
            .is_empty(),
        "a batch brought a released key back"
    );
    for (key, owner, _) in &held {
        assert_eq!(
            backend.release(key, owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    // The shared lease outlives its keys (other holds may join it); nothing is left held.
    for (key, _, _) in &held {
        assert!(backend.inspect(key).await.unwrap().is_none());
    }
    backend.shutdown().await;
}

/// A release that never reached etcd, of a key renewed on the shared lease, still frees the
/// key by the end of its lease, although the backend keeps renewing its other holds on that
/// same lease: a failed release must not leave the key living on as long as the backend
/// lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_of_a_key_on_the_shared_lease_still_frees_it() {
    use conformance_tests::{FaultLink, TcpProxy};
    let ttl = common::TTL;
    let cfg = EtcdConfig::parse(&url_from_env("DISTLOCK_TEST_ETCD_URL")).unwrap();
    let upstream: std::net::SocketAddr = cfg.endpoints[0]
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = TcpProxy::start(upstream).await.unwrap();
    let namespace = random_namespace();
    let backend = EtcdBackend::new(
        EtcdConfig::new([proxy.addr().to_string()])
            .with_namespace(&namespace)
            .unwrap()
            .with_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let (orphan, kept) = (
        LockKey::new("orphan").unwrap(),
        LockKey::new("kept").unwrap(),
    );
    let (owner, other) = (Owner::new("holder"), Owner::new("holder"));
    for (key, owner) in [(&orphan, &owner), (&kept, &other)] {
        let outcome = backend.try_acquire(key, owner, ttl).await.unwrap();
        assert!(
            matches!(outcome, AcquireOutcome::Acquired(_)),
            "{outcome:?}"
        );
    }
    // One batched renewal moves both keys onto the backend's shared lease.
    let both = [
        Renewal::new(&orphan, &owner, ttl),
        Renewal::new(&kept, &other, ttl),
    ];
    for outcome in backend.renew(&both).await.unwrap() {
        assert!(
            matches!(outcome, Ok(ExtendOutcome::Extended(_))),
            "{outcome:?}"
        );
    }
    // The release is held in the proxy until it gives up, then dropped with the
    // connection: it never reaches etcd.
    proxy.pause().await;
    let released = tokio::time::timeout(ttl / 2, backend.release(&orphan, &owner)).await;
    proxy.cut().await;
    proxy.resume().await;
    let failed_at = std::time::Instant::now();
    match released {
        Err(_) | Ok(Err(_)) => {}
        Ok(Ok(outcome)) => panic!("a release that never reached etcd answered {outcome:?}"),
    }
    // The backend keeps renewing its other hold, on the same shared lease; another client
    // (straight to etcd) must get the orphaned key within its lease.
    let watcher = EtcdBackend::new(cfg.with_namespace(&namespace).unwrap()).unwrap();
    let stranger = Owner::new("stranger");
    let bound = ttl * 2 + Duration::from_secs(1);
    loop {
        let renewed = backend.renew(&both[1..]).await;
        assert!(
            matches!(renewed.as_deref(), Ok([Ok(ExtendOutcome::Extended(_))])),
            "the other hold must stay renewed: {renewed:?}"
        );
        if let AcquireOutcome::Acquired(_) =
            watcher.try_acquire(&orphan, &stranger, ttl).await.unwrap()
        {
            break;
        }
        assert!(
            failed_at.elapsed() < bound,
            "the key whose release was lost is still held {:?} later, while its backend \
             renews its other hold",
            failed_at.elapsed()
        );
        tokio::time::sleep(ttl / 4).await;
    }
}

/// A renewal of a hold on the shared lease after the same owner's claim was granted again
/// reads the place: a place deleted behind the backend's back is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_after_a_re_grant_does_not_pass_for_a_deleted_place() {
    let cfg = EtcdConfig::parse(&url_from_env("DISTLOCK_TEST_ETCD_URL"))
        .unwrap()
        .with_namespace(&random_namespace())
        .unwrap();
    let backend = EtcdBackend::new(cfg.clone()).unwrap();
    let mut raw = Client::connect(cfg.endpoints.clone(), None).await.unwrap();
    let key = LockKey::new("unknown-revision").unwrap();
    let owner = Owner::new("holder");
    let granted = |o: AcquireOutcome| matches!(o, AcquireOutcome::Acquired(_));
    assert!(granted(
        backend.try_acquire(&key, &owner, TTL).await.unwrap()
    ));
    // Moved onto the shared lease, its revision recorded.
    let renewal = [Renewal::new(&key, &owner, TTL)];
    let moved = backend.renew(&renewal).await.unwrap();
    assert!(
        matches!(moved[..], [Ok(ExtendOutcome::Extended(_))]),
        "{moved:?}"
    );
    // The same owner's claim again: granted, the key's revision no longer known here.
    assert!(granted(
        backend.try_acquire(&key, &owner, TTL).await.unwrap()
    ));
    raw.delete(
        backend.etcd_key(&key),
        Some(DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    let renewed = backend.renew(&renewal).await.unwrap();
    assert!(
        matches!(renewed[..], [Ok(ExtendOutcome::NotHeld)]),
        "a deleted key renewed: {renewed:?}"
    );
}
