//! How lock keys and holders are stored in etcd.

use lockcore::driver::OwnerToken;
use lockcore::{Claim, LockKey, Owner};

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

/// The etcd keys of one backend instance's places in a lock's queue:
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

/// The etcd key of place `slot` of a backend instance in a lock's queue:
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

/// Version tag of the value of an exclusive hold (and of every value written before shared
/// claims existed): `"1" + hex(owner token) + label`.
const VALUE_V1: u8 = b'1';
/// Version tag of the value of a shared claim or semaphore permits:
/// `"2" + hex(owner token) + hex8(weight) + hex8(capacity) + label`.
const VALUE_V2: u8 = b'2';
/// Where the label starts in a value of each version.
const LABEL_V1: usize = 33;
const LABEL_V2: usize = 49;

/// The value of a held lock: `"1" + hex(owner token) + label`. The token is what release
/// and extend compare; inspect shows only the label.
pub(crate) fn holder_value(owner: &Owner) -> Vec<u8> {
    let mut out = Vec::with_capacity(LABEL_V1 + owner.label().len());
    out.push(VALUE_V1);
    out.extend_from_slice(&owner.token().hex_digits());
    out.extend_from_slice(owner.label().as_bytes());
    out
}

/// The value of a place that claims `claim`: [`holder_value`] for an exclusive claim (so
/// exclusive places read as they always did), else version 2 with the claim's weight and
/// capacity, which later claims add up and compare.
pub(crate) fn claim_value(owner: &Owner, claim: &Claim) -> Vec<u8> {
    if claim.is_exclusive() {
        return holder_value(owner);
    }
    let mut out = Vec::with_capacity(LABEL_V2 + owner.label().len());
    out.push(VALUE_V2);
    out.extend_from_slice(owner.token().to_hex().as_bytes());
    // Both fit 8 hex digits: weights and capacities are at most u32::MAX.
    out.extend_from_slice(format!("{:08x}{:08x}", claim.weight(), claim.capacity()).as_bytes());
    out.extend_from_slice(owner.label().as_bytes());
    out
}

/// Where a value's label starts, for the value versions this driver writes.
fn label_start(value: &[u8]) -> Option<usize> {
    match value.first() {
        Some(&VALUE_V1) if value.len() >= LABEL_V1 => Some(LABEL_V1),
        Some(&VALUE_V2) if value.len() >= LABEL_V2 => Some(LABEL_V2),
        _ => None,
    }
}

/// Whether a stored value names `token` as its holder.
pub(crate) fn held_by(value: &[u8], token: &OwnerToken) -> bool {
    label_start(value).is_some() && value[1..33] == token.hex_digits()
}

/// What a stored value claims: its weight and capacity (version 2), else the whole key —
/// also for a value this driver did not write, which then blocks every claim rather than
/// being counted as nothing.
pub(crate) fn claim_of(value: &[u8]) -> Claim {
    if label_start(value) != Some(LABEL_V2) {
        return Claim::exclusive();
    }
    let hex = |range: std::ops::Range<usize>| {
        std::str::from_utf8(&value[range])
            .ok()
            .and_then(|s| u64::from_str_radix(s, 16).ok())
    };
    match (hex(33..41), hex(41..49)) {
        (Some(weight), Some(capacity)) => {
            Claim::from_parts(weight, capacity).unwrap_or_else(Claim::exclusive)
        }
        _ => Claim::exclusive(),
    }
}

/// The holder's label in a stored value.
pub(crate) fn label_of(value: &[u8]) -> String {
    match label_start(value) {
        Some(start) => String::from_utf8_lossy(&value[start..]).into_owned(),
        // What etcd's own lock recipe writes: an empty value.
        None if value.is_empty() => String::from("<etcd lock: etcdctl lock or concurrency.Mutex>"),
        // Not written by this driver or the recipe: show nothing of it rather than guess.
        None => String::from("<unknown holder>"),
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
        assert_eq!(claim_of(&v), Claim::exclusive());
        // What `etcdctl lock` and Go's `concurrency.Mutex` write: an exclusive place, named
        // for what wrote it.
        assert_eq!(claim_of(b""), Claim::exclusive());
        assert_eq!(
            label_of(b""),
            "<etcd lock: etcdctl lock or concurrency.Mutex>"
        );
    }

    #[test]
    fn claim_values_carry_weight_and_capacity() {
        let o = Owner::new("reader");
        for claim in [Claim::shared(), Claim::permits(3, 8).unwrap()] {
            let v = claim_value(&o, &claim);
            assert!(held_by(&v, o.token()));
            assert_eq!(claim_of(&v), claim);
            assert_eq!(label_of(&v), "reader");
        }
        assert_eq!(claim_value(&o, &Claim::exclusive()), holder_value(&o));
        // Nonsense weights read as the whole key: they block, never count as nothing.
        let mut v = claim_value(&o, &Claim::permits(1, 2).unwrap());
        v[33..41].copy_from_slice(b"00000009");
        assert_eq!(claim_of(&v), Claim::exclusive());
        assert_eq!(claim_of(b"2short"), Claim::exclusive());
    }
}
