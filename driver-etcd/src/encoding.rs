//! How lock keys and holders are stored in etcd.

use lockcore::{LockKey, Owner, OwnerToken};

/// The etcd key of a lock: `namespace + escaped(key) + "/"`.
///
/// Only `%` and `/` are escaped (as `%25`, `%2F`), so keys stay readable in `etcdctl`,
/// the encoding is one-to-one, and since an escaped key never contains `/`, the
/// terminator makes sure no lock's etcd key is a prefix of another's (etcd ranges and
/// watches work on prefixes).
pub(crate) fn lock_key(namespace: &str, key: &LockKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(namespace.len() + key.as_bytes().len() + 1);
    out.extend_from_slice(namespace.as_bytes());
    for &b in key.as_bytes() {
        match b {
            b'%' => out.extend_from_slice(b"%25"),
            b'/' => out.extend_from_slice(b"%2F"),
            _ => out.push(b),
        }
    }
    out.push(b'/');
    out
}

/// The etcd keys of one backend instance's places in a FIFO lock's queue:
/// `lock_key(namespace, key) + hex(backend id)`, followed by a slot number
/// ([`queue_key`]).
///
/// The lock's etcd key is the queue's prefix. Since an escaped lock key contains no `/`,
/// the range of one lock's prefix holds no other lock's places (the prefix of lock `a`,
/// `ns/a/`, cannot begin `ns/a%2Fb/`, the prefix of lock `a/b`).
pub(crate) fn backend_places(namespace: &str, key: &LockKey, backend: u64) -> Vec<u8> {
    let mut out = lock_key(namespace, key);
    out.extend_from_slice(format!("{backend:016x}").as_bytes());
    out
}

/// The etcd key of place `slot` of a backend instance in a FIFO lock's queue:
/// `lock_key + hex(backend id) + hex(slot)`, fixed length.
///
/// Named by slot, not by owner, so the names a lock's queue ever uses stay few (a backend
/// reuses its slots): etcd keeps every deleted key in its index until compaction, and each
/// range over the queue would walk them all if every acquisition left a new name behind.
/// The owner is in the value, and every operation on a place compares it.
pub(crate) fn queue_key(namespace: &str, key: &LockKey, backend: u64, slot: u32) -> Vec<u8> {
    let mut out = backend_places(namespace, key, backend);
    out.extend_from_slice(format!("{slot:08x}").as_bytes());
    out
}

/// The key marking which lock layout a namespace uses: the namespace itself, which no
/// lock key and no queue place can equal (both append a non-empty escaped key).
pub(crate) fn layout_marker(namespace: &str) -> Vec<u8> {
    namespace.as_bytes().to_vec()
}

/// Version tag of the value layout.
const VALUE_V1: u8 = b'1';

/// The value of a held lock: `"1" + hex(owner token) + label`. The token is what release
/// and extend compare; inspect shows only the label.
pub(crate) fn holder_value(owner: &Owner) -> Vec<u8> {
    let mut out = Vec::with_capacity(33 + owner.label().len());
    out.push(VALUE_V1);
    out.extend_from_slice(owner.token().to_hex().as_bytes());
    out.extend_from_slice(owner.label().as_bytes());
    out
}

/// Whether a stored value names `token` as its holder.
pub(crate) fn held_by(value: &[u8], token: &OwnerToken) -> bool {
    value.len() >= 33 && value[0] == VALUE_V1 && value[1..33] == *token.to_hex().as_bytes()
}

/// The holder's label in a stored value.
pub(crate) fn label_of(value: &[u8]) -> String {
    if value.len() >= 33 && value[0] == VALUE_V1 {
        String::from_utf8_lossy(&value[33..]).into_owned()
    } else {
        // Not written by this driver: show nothing of it rather than guess.
        String::from("<unknown holder>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_is_a_prefix_of_another() {
        let ns = "ns/";
        let keys = [
            "a", "ab", "a/", "a/b", "a%2F", "a%", "A", "a ", "é", "%", "/",
        ];
        let enc: Vec<_> = keys
            .iter()
            .map(|k| lock_key(ns, &LockKey::new(*k).unwrap()))
            .collect();
        for (i, a) in enc.iter().enumerate() {
            for (j, b) in enc.iter().enumerate() {
                if i != j {
                    assert!(
                        !b.starts_with(a),
                        "{:?} is a prefix of {:?}",
                        keys[i],
                        keys[j]
                    );
                }
            }
        }
        assert_eq!(
            lock_key(ns, &LockKey::new("a/b%").unwrap()),
            b"ns/a%2Fb%25/"
        );
    }

    #[test]
    fn queue_places_stay_inside_their_lock() {
        let ns = "ns/";
        let keys = [
            "a", "ab", "a/", "a/b", "a%2F", "a%", "A", "a ", "é", "%", "/",
        ];
        for (i, a) in keys.iter().enumerate() {
            let prefix = lock_key(ns, &LockKey::new(*a).unwrap());
            for (j, b) in keys.iter().enumerate() {
                let place = queue_key(ns, &LockKey::new(*b).unwrap(), u64::MAX, 7);
                assert_eq!(
                    place.starts_with(&prefix),
                    i == j,
                    "the queue of {a:?} and a place of {b:?}"
                );
            }
            assert_ne!(prefix, layout_marker(ns));
        }
        let k = LockKey::new("k").unwrap();
        assert_eq!(queue_key(ns, &k, 0xab, 2), b"ns/k/00000000000000ab00000002");
        assert!(queue_key(ns, &k, 0xab, 2).starts_with(&backend_places(ns, &k, 0xab)));
        assert!(!queue_key(ns, &k, 0xac, 2).starts_with(&backend_places(ns, &k, 0xab)));
    }

    #[test]
    fn values_name_the_holder() {
        let o = Owner::new("worker-1");
        let v = holder_value(&o);
        assert!(held_by(&v, o.token()));
        assert!(!held_by(&v, Owner::new("worker-1").token()));
        assert_eq!(label_of(&v), "worker-1");
        assert!(!label_of(&v).contains(&o.token().to_hex()));
        assert!(!held_by(b"junk", o.token()));
    }
}
