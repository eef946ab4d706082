//! A holder's place written behind the driver's back (etcdctl, another tool), its lease
//! kept: the token stays the place's create revision, and a value that is no longer the
//! holder's is seen as lost by the next extension, however alive the lease is.

mod common;

use std::time::Duration;

use common::{random_namespace, url_from_env};
use distlock_etcd::etcd_client::{Client, GetOptions, PutOptions};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt};
use lockcore::{LockBackend, LockKey, Owner};

const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_key_keeps_its_token_and_a_foreign_value_is_lost() {
    let cfg = EtcdConfig::parse(&url_from_env("DISTLOCK_TEST_ETCD_URL"))
        .unwrap()
        .with_namespace(&random_namespace())
        .unwrap();
    let backend = EtcdBackend::new(cfg.clone()).unwrap();
    let mut raw = Client::connect(cfg.endpoints.clone(), None).await.unwrap();
    let key = LockKey::new("rewritten").unwrap();
    let queue = backend.etcd_key(&key);
    let owner = Owner::new("holder");

    let AcquireOutcome::Acquired(grant) = backend.try_acquire(&key, &owner, TTL).await.unwrap()
    else {
        panic!("a free key was not granted");
    };
    // The holder's place: the only key of the lock's queue.
    let all = Some(GetOptions::new().with_prefix());
    let kv = raw.get(queue, all).await.unwrap().kvs()[0].clone();
    let etcd_key = kv.key().to_vec();
    assert_eq!(grant.token.0, u64::try_from(kv.create_revision()).unwrap());

    // The same value written again on the same lease: a new mod revision, same incarnation.
    let lease = PutOptions::new().with_lease(kv.lease());
    raw.put(etcd_key.clone(), kv.value().to_vec(), Some(lease))
        .await
        .unwrap();
    match backend.extend(&key, &owner, TTL).await.unwrap() {
        ExtendOutcome::Extended(g) => assert_eq!(
            g.token, grant.token,
            "an extension after a rewrite reported another token"
        ),
        ExtendOutcome::NotHeld => panic!("the holder's own value, rewritten, was seen as lost"),
    }
    let AcquireOutcome::Acquired(again) = backend.try_acquire(&key, &owner, TTL).await.unwrap()
    else {
        panic!("the holder's re-grant was refused");
    };
    assert_eq!(
        again.token, grant.token,
        "a re-grant after a rewrite changed the token"
    );

    // Someone else's value on the holder's (live) lease: no longer the holder's lock. The
    // lease the place is on now, which the renewal above moved onto the backend's shared one.
    let now_on = raw.get(etcd_key.clone(), None).await.unwrap().kvs()[0].lease();
    raw.put(
        etcd_key.clone(),
        b"somebody else".to_vec(),
        Some(PutOptions::new().with_lease(now_on)),
    )
    .await
    .unwrap();
    assert!(
        matches!(
            backend.extend(&key, &owner, TTL).await.unwrap(),
            ExtendOutcome::NotHeld
        ),
        "a live lease was taken as proof that the key is still the holder's"
    );
    // Nor does the holder's release delete what someone else wrote there.
    assert_eq!(
        backend.release(&key, &owner).await.unwrap(),
        lockcore::ReleaseOutcome::NotHeld
    );
    let left = raw.get(etcd_key.clone(), None).await.unwrap();
    assert_eq!(
        left.kvs().first().map(|kv| kv.value().to_vec()),
        Some(b"somebody else".to_vec()),
        "a release deleted a place that is no longer the holder's"
    );
    raw.delete(etcd_key, None).await.unwrap();
}
