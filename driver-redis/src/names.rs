//! How lock keys become Redis key and channel names.
//!
//! Public (but hidden from the docs) for driver-redlock; not a stable API.
//!
//! A lock key `K` under prefix `P` lives at `P{E(K)}`, its fence counter at
//! `P{E(K)}:fence`, its shared leases at `P{E(K)}:leases` (a sorted set) and
//! `P{E(K)}:claims` (a hash of their data, the capacity and the reservation), and its
//! release channel is `P{E(K)}:released`. `E` escapes `%`, `{` and
//! `}` as `%25`, `%7B`, `%7D` and keeps every other character as it is, so:
//!
//! * the hash tag (the text between the first `{` and the next `}`) is exactly `E(K)`:
//!   the lock and fence keys of one lock always share a Cluster slot, whatever `K` holds;
//! * `E` is injective and `E(K)` never contains `}`, so the closing brace marks where the
//!   encoded key ends: no lock key, fence key or channel of one lock key can equal one of
//!   another (a key named `a}:fence` is stored at `P{a%7D:fence}`, not `P{a}:fence`).

use lockcore::{LockError, LockKey};
use redis::{Script, ScriptInvocation};

/// The Redis names of one lock (the fence key and channel are built only when needed).
#[derive(Debug, Clone)]
pub struct Names {
    /// The lock's key: `P{E(K)}`.
    pub lock: String,
}

impl Names {
    /// The fence counter's key: same hash tag as the lock key.
    pub fn fence(&self) -> String {
        format!("{}:fence", self.lock)
    }

    /// The sorted set of shared leases (owner → expiry in server-time µs): same hash tag.
    pub fn leases(&self) -> String {
        format!("{}:leases", self.lock)
    }

    /// The hash beside [`leases`](Self::leases): each lease's weight, token and label, the
    /// key's capacity, the reservation, the change stamp and the waiter mark.
    pub fn claims(&self) -> String {
        format!("{}:claims", self.lock)
    }

    /// The channel releases are announced on (`RELEASE` builds the same name in Lua).
    pub fn channel(&self) -> String {
        format!("{}:released", self.lock)
    }

    /// A call of `script` on the keys most scripts take: `KEYS[1]` the lock, `KEYS[2]` its
    /// [`leases`](Self::leases), `KEYS[3]` its [`claims`](Self::claims).
    pub fn call<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.key(&self.lock);
        invocation.key(self.leases()).key(self.claims());
        invocation
    }
}

/// Checks a key prefix: braces would move the hash tag into the prefix (and an empty tag
/// `{}` would make Redis hash the whole name, splitting a lock from its fence key).
pub fn check_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.contains(['{', '}']) {
        return Err(LockError::config(format!(
            "the redis key prefix {prefix:?} contains a brace; distlock adds the hash tag itself"
        )));
    }
    if prefix.chars().any(char::is_control) {
        return Err(LockError::config(
            "the redis key prefix contains control characters",
        ));
    }
    Ok(())
}

/// The escaped form of a key, as it appears inside the hash tag, appended to `out`.
fn encode_into(out: &mut String, key: &str) {
    // Most keys hold none of the three characters: one copy.
    if !key.contains(['%', '{', '}']) {
        out.push_str(key);
        return;
    }
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// The names of `key` under `prefix`.
pub fn names(prefix: &str, key: &LockKey) -> Names {
    // Built by hand rather than by `format!`: this runs on every operation.
    let mut lock = String::with_capacity(prefix.len() + key.as_str().len() + 2);
    write_lock(&mut lock, prefix, key);
    Names { lock }
}

/// Appends the lock key of `key` under `prefix` (the [`Names::lock`] of [`names`]) to
/// `out`: for a request over many locks, written into one buffer.
pub(crate) fn write_lock(out: &mut String, prefix: &str, key: &LockKey) {
    out.push_str(prefix);
    out.push('{');
    encode_into(out, key.as_str());
    out.push('}');
}

/// The Redis Cluster slot of a name written by [`write_lock`] (or any name beside it):
/// CRC16 (XMODEM) of its hash tag, modulo 16384, as the server computes it.
pub(crate) fn slot(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn tag(name: &str) -> &str {
        let open = name.find('{').unwrap();
        let close = open + name[open..].find('}').unwrap();
        &name[open + 1..close]
    }

    #[test]
    fn lock_and_fence_share_the_tag() {
        for k in ["a", "{", "}", "{}", "a}:fence", "%7B", "x{y}z", "ключ"] {
            let n = names("p:", &LockKey::new(k).unwrap());
            assert_eq!(tag(&n.lock), tag(&n.fence()), "{k}");
            assert_eq!(tag(&n.lock), tag(&n.leases()), "{k}");
            assert_eq!(tag(&n.lock), tag(&n.claims()), "{k}");
            let mut encoded = String::new();
            encode_into(&mut encoded, k);
            assert_eq!(tag(&n.lock), encoded);
            assert!(!tag(&n.lock).is_empty());
        }
    }

    #[test]
    fn hostile_keys_never_collide() {
        let keys = [
            "a",
            "a}",
            "a}:fence",
            "a:fence",
            "{a}",
            "%7D",
            "}",
            "%",
            "%25",
            "a%7D:fence",
            "A",
            "a ",
            " a",
            "*",
            "\\",
            "'\"",
            "a}:released",
            "a}:leases",
            "a}:claims",
            "a:leases",
        ];
        let mut seen = HashSet::new();
        for k in keys {
            let n = names("p:", &LockKey::new(k).unwrap());
            for name in [n.fence(), n.channel(), n.leases(), n.claims(), n.lock] {
                assert!(seen.insert(name.clone()), "{k} collides at {name}");
            }
        }
    }

    #[test]
    fn slots_are_the_servers() {
        // `CLUSTER KEYSLOT` answers of a Redis 7 server.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), 3443);
        assert_eq!(slot("foo{}{bar}"), 8363);
        assert_eq!(slot("foo{{bar}}zap"), 4015);
        assert_eq!(slot("foo{bar}{zap}"), 5061);
        let n = names("p:", &LockKey::new("invoice:42").unwrap());
        assert_eq!(slot(&n.lock), slot(&n.fence()));
        assert_eq!(slot(&n.lock), slot(&n.channel()));
        assert_eq!(slot(&n.lock), slot("invoice:42"));
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("distlock:").is_ok());
        assert!(check_prefix("a{b}").is_err());
        assert!(check_prefix("a}").is_err());
    }
}
