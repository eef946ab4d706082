//! A lock table's statements, as each database spells them, and the values they bind.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{Claim, LockKey, Owner};
use sqlx::AssertSqlSafe;

use crate::units::ttl_micros;

/// The statements of one lock table in its database's dialect. The table name is the only
/// text spliced into them; keys, owners, labels and durations are bound.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Takes a free or expired row, re-grants it to its owner (same token, expiry never
    /// shortened), or leaves it alone. Binds key, owner, label, TTL (µs).
    pub(crate) acquire: Bound,
    /// The live row's label, fence and remaining microseconds. Binds the key.
    pub(crate) state: Bound,
    /// Renewals of many exclusive holds at once, if the dialect has them: entry `k` renews
    /// `2^k` rows (up to [`lockcore::driver::RENEWAL_BATCH`]). See [`BatchRenewal`].
    pub(crate) extend_many: Vec<BatchRenewal>,
    /// Marks the owner's live row expired. Binds key, owner.
    pub(crate) release: Bound,
    /// Frees the key whoever holds it: every lease and the reservation. Binds the key;
    /// the first statement's changed rows say whether it freed anything.
    /// They run one after the other in one transaction (PostgreSQL says the same in one
    /// statement with data-modifying `WITH`), stopping after a first one that changed no row.
    pub(crate) force_release: Vec<Bound>,
    /// Deletes rows expired and granted longer than the grace ago (and without a live
    /// reservation). Binds the grace (µs).
    pub(crate) gc: Arc<str>,
    /// Marks the key as the next turn of a request that has waited long
    /// ([`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)): records the
    /// owner's reservation, with its arrival (`now − waited`) and a short life, unless
    /// another owner's lives that arrived no later (its own keeps its earliest arrival).
    /// Only on a key of an exclusive or read-write capacity; changes nothing elsewhere.
    /// Binds key, owner, the mark's TTL and the wait (µs), by [`P`].
    pub(crate) mark: Bound,
    /// Shared claims: the leases table's statements.
    pub(crate) claims: ClaimStatements,
    /// The fence of a key a transaction holds, where the database shows such a hold to
    /// other sessions (PostgreSQL: `held` in `transaction.sql`); no row when none holds
    /// it. Binds the key.
    pub(crate) transaction_hold: Option<Bound>,
}

/// The statements that renew a batch of exclusive holds. Both bind, per row, index (from
/// 1), key, owner, TTL (µs); rows past the renewals at hand bind index 0 and empty key and
/// owner, which match no row.
#[derive(Debug)]
pub(crate) struct BatchRenewal {
    /// Pushes the expiry of each owner's live row out, never in, answering nothing (MySQL,
    /// whose `UPDATE` returns no rows); run before [`answer`](Self::answer).
    pub(crate) update: Option<Arc<str>>,
    /// Answers `(index, fence)` for each row renewed (PostgreSQL: the renewing `UPDATE …
    /// RETURNING` itself; MySQL: the rows the update left live and the owner's).
    pub(crate) answer: Arc<str>,
}

/// The statements of shared claims (read-write locks, semaphores). A claim, a lease's
/// release and its renewal are each one call: a stored routine (PostgreSQL, MySQL) or one
/// statement and its triggers (SQLite), which takes the key's row lock before it reads the
/// leases, decides and writes.
#[derive(Debug)]
pub(crate) struct ClaimStatements {
    /// Decides and writes a claim. Answers `[kind, token, remaining, by_reservation,
    /// revision]` (see [`Decision::from_call`](crate::backend::claims::Decision::from_call)).
    pub(crate) claim: Bound,
    /// Decides and writes the claims of a whole set in one call, all or nothing, where the
    /// dialect has it (PostgreSQL's function, MySQL's procedure): binds the set's keys
    /// packed ([`pack_keys`]), then owner, label, weight, TTL and capacity, the same for
    /// every key. Answers a row as [`claim`](Self::claim) does per key decided, in order:
    /// every key when all were granted, else up to the first one that was not, with
    /// nothing of the set written. Elsewhere (SQLite) a set is a transaction of the client's
    /// of [`claim`](Self::claim) per key.
    pub(crate) claim_set: Option<Bound>,
    /// Releases the owner's live lease (and announces it): `[1]` released, `[0]` (or no
    /// row) the owner holds no live lease.
    pub(crate) release: Bound,
    /// Renews the owner's live lease and the row, never shortening either: `[fence]`, or
    /// `[-1]` (or no row) when the owner holds no live lease.
    pub(crate) extend: Bound,
    /// Reads the key's row, if there is one, without locking it: `[reserved, fence]`
    /// (PostgreSQL: a wait behind a reservation checks it still stands; the pollers of the
    /// others look on their own).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) peek: Option<Bound>,
    /// The key's live leases as `holders` shows them: label, fence, weight, capacity,
    /// remaining µs, in grant order.
    pub(crate) shown: Bound,
    /// Removes the owner's live reservation (and announces it); the rows it changed say
    /// whether there was one.
    pub(crate) abandon: Bound,
    /// Deletes expired leases. Binds nothing.
    pub(crate) gc: Arc<str>,
}

/// What a claim statement binds, in the order of its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum P {
    Key,
    Owner,
    Label,
    Weight,
    /// The TTL in microseconds.
    Ttl,
    Capacity,
    /// How long the request has waited, in microseconds (0 for one that did not say):
    /// its arrival is `now − waited` on the database's clock.
    Waited,
    /// The keys of a set, packed ([`pack_keys`]).
    Keys,
}

/// What a statement binds, by [`P`]: the values of one call.
pub(crate) struct Values<'a> {
    key: &'a [u8],
    owner: &'a [u8],
    label: &'a str,
    weight: i64,
    pub(crate) ttl: i64,
    capacity: i64,
    /// How long the request has waited, in microseconds.
    pub(crate) waited: i64,
    /// The keys of a set, packed ([`pack_keys`]).
    keys: &'a [u8],
}

impl<'a> Values<'a> {
    pub(crate) fn new(key: &'a LockKey, owner: &'a Owner) -> Self {
        Values {
            owner: owner.token().as_bytes().as_slice(),
            label: owner.label(),
            ..Values::key(key)
        }
    }

    /// The values of a statement that binds only the key.
    pub(crate) fn key(key: &'a LockKey) -> Self {
        Values {
            key: key.as_bytes(),
            owner: &[],
            label: "",
            weight: 0,
            ttl: 0,
            capacity: 0,
            waited: 0,
            keys: &[],
        }
    }

    pub(crate) fn claim(mut self, ttl: Duration, claim: &Claim) -> Self {
        self.ttl = ttl_micros(ttl);
        self.weight = i64::try_from(claim.weight()).unwrap_or(i64::MAX);
        self.capacity = i64::try_from(claim.capacity()).unwrap_or(i64::MAX);
        self
    }

    /// The values of a set's call: the first request's owner, TTL and claim (the same in
    /// every request of a set), and `keys`, the set's keys packed ([`pack_keys`]).
    pub(crate) fn set(key: &'a LockKey, owner: &'a Owner, keys: &'a [u8]) -> Self {
        Values {
            keys,
            ..Values::new(key, owner)
        }
    }

    /// The values of `params`, in order.
    pub(crate) fn bind(&self, params: &[P]) -> Vec<Value<'a>> {
        params
            .iter()
            .map(|p| match p {
                P::Key => Value::Bytes(self.key),
                P::Owner => Value::Bytes(self.owner),
                P::Label => Value::Text(self.label),
                P::Weight => Value::Int(self.weight),
                P::Ttl => Value::Int(self.ttl),
                P::Capacity => Value::Int(self.capacity),
                P::Waited => Value::Int(self.waited),
                P::Keys => Value::Bytes(self.keys),
            })
            .collect()
    }
}

/// The keys of a set as one value a set's call binds: each key as one byte of length then
/// its bytes, in order. A [`LockKey`] is 1 to 255 bytes, so its length fits the byte; the
/// store splits them again (`claim_set.sql`). One value, whatever the set's size, so one
/// statement serves every set, on every database.
pub(crate) fn pack_keys<'k>(keys: impl IntoIterator<Item = &'k LockKey>) -> Vec<u8> {
    let mut packed = Vec::new();
    for key in keys {
        let bytes = key.as_bytes();
        // A key of more than 255 bytes is no LockKey; were there one, its length would
        // be cut, not wrapped into another key.
        packed.push(u8::try_from(bytes.len()).unwrap_or(u8::MAX));
        packed.extend_from_slice(&bytes[..bytes.len().min(255)]);
    }
    packed
}

/// A statement and what it binds, in order.
#[derive(Debug)]
pub(crate) struct Bound {
    pub(crate) sql: Arc<str>,
    pub(crate) params: Vec<P>,
}

/// A statement of a store file (`.sql`, written for the default table `distlock_locks`) for
/// lock table `t`: its comment lines (`--` first on the line) left out, and the default
/// table's name, wherever it occurs (`distlock_locks_leases`, `distlock_locks_claim`, …),
/// replaced by `t`, the only text spliced.
pub(crate) fn from_file(text: &str, t: &str) -> String {
    let lines: Vec<&str> = (text.lines())
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect();
    lines.join("\n").replace(crate::DEFAULT_TABLE, t)
}

/// A dialect's statements, loaded for lock table `t` from its files `lock` (the exclusive
/// lock's statements) and `leases` (the shared claims'), each statement under a line
/// `-- name: NAME BINDS…` that names what it binds, in order; the batch renewals are the
/// dialect's own, `batch(t, rows)` for each power of two of rows up to
/// [`lockcore::driver::RENEWAL_BATCH`] (so that few statements are prepared). A statement a
/// file lacks is empty (each dialect's tests check that
/// every one is there), but `force_leases`, `peek` and `claim_set`, which only some
/// dialects have.
pub(crate) fn load(
    lock: &str,
    leases: &str,
    t: &str,
    batch: fn(&str, usize) -> BatchRenewal,
) -> Statements {
    let sizes = std::iter::successors(Some(1), |rows| Some(rows * 2));
    let extend_many = (sizes.take_while(|&rows| rows <= lockcore::driver::RENEWAL_BATCH))
        .map(|rows| batch(t, rows))
        .collect();
    let text = |file, name| named(file, name, t).map_or_else(String::new, |b| b.sql.to_string());
    let bound = |file, name| named(file, name, t).unwrap_or_else(Bound::empty);
    Statements {
        acquire: bound(lock, "acquire"),
        state: bound(lock, "state"),
        extend_many,
        release: bound(lock, "release"),
        force_release: ["force_release", "force_leases"]
            .into_iter()
            .filter_map(|name| named(lock, name, t))
            .collect(),
        gc: text(lock, "gc").into(),
        mark: bound(lock, "mark"),
        claims: ClaimStatements {
            claim: bound(leases, "claim"),
            claim_set: named(leases, "claim_set", t),
            release: bound(leases, "release_lease"),
            extend: bound(leases, "extend_lease"),
            peek: named(leases, "peek", t),
            shown: bound(leases, "shown"),
            abandon: bound(leases, "abandon"),
            gc: text(leases, "gc_leases").into(),
        },
        transaction_hold: None,
    }
}

impl Bound {
    pub(crate) fn empty() -> Self {
        Bound {
            sql: "".into(),
            params: Vec::new(),
        }
    }
}

/// The statement `name` of store file `text` (its lines after `-- name: NAME BINDS…`, up to
/// the next such line) as [`from_file`] loads it for lock table `t`, with what it binds.
pub(crate) fn named(text: &str, name: &str, t: &str) -> Option<Bound> {
    let mut parts = text.split("-- name: ").skip(1);
    let part = parts.find(|part| part.split_whitespace().next() == Some(name))?;
    let (head, body) = part.split_once('\n')?;
    let params = (head.split_whitespace().skip(1))
        .map(|bind| match bind {
            "key" => Some(P::Key),
            "owner" => Some(P::Owner),
            "label" => Some(P::Label),
            "weight" => Some(P::Weight),
            "ttl" => Some(P::Ttl),
            "capacity" => Some(P::Capacity),
            "waited" => Some(P::Waited),
            "keys" => Some(P::Keys),
            _ => None,
        })
        .collect::<Option<Vec<P>>>()?;
    Some(Bound {
        sql: from_file(body, t).trim().into(),
        params,
    })
}

/// A statement as sqlx takes it (the driver's statements splice only a validated table name).
pub(crate) fn sql(s: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(s.clone())
}

/// One value bound to a statement.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
    Int(i64),
}

/// A statement and the values it binds, in order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call<'a> {
    pub(crate) statement: &'a Arc<str>,
    pub(crate) values: &'a [Value<'a>],
}

/// Checks that every statement of `s`, made for the table `locks`, was loaded from its file,
/// and that each bound one names as many binds as it has parameters (`$n`, `?n` or `?`).
#[cfg(test)]
pub(crate) fn assert_loaded(s: &Statements) {
    let c = &s.claims;
    let single = [&s.gc, &c.gc];
    let bound = [&s.acquire, &s.state, &s.release, &s.mark, &c.claim]
        .into_iter()
        .chain([&c.release, &c.extend, &c.shown])
        .chain(&c.peek)
        .chain(&c.claim_set)
        .chain(&s.force_release)
        .chain([&c.abandon])
        .chain(&s.transaction_hold);
    for statement in single.into_iter().chain(bound.clone().map(|b| &b.sql)) {
        assert!(!statement.is_empty());
        let clean = !statement.contains("distlock_locks") && !statement.contains("-- ");
        assert!(clean, "{statement}");
    }
    for b in bound {
        let numbered = |mark: char| {
            (b.sql.split(mark).skip(1))
                .filter_map(|rest| rest.split(|ch: char| !ch.is_ascii_digit()).next())
                .filter_map(|n| n.parse::<usize>().ok())
                .max()
        };
        let count = numbered('$')
            .or_else(|| numbered('?'))
            .unwrap_or_else(|| b.sql.matches('?').count());
        assert_eq!(b.params.len(), count, "{}", b.sql);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each key as its length in one byte, then its bytes, in order: a key of 255 bytes
    /// and one of 1 side by side stay two keys.
    #[test]
    fn keys_are_packed_by_length() {
        let long = "é".repeat(127) + "x";
        let keys = [
            LockKey::new(long.as_str()).unwrap(),
            LockKey::new("a").unwrap(),
        ];
        let packed = pack_keys(&keys);
        assert_eq!(packed.len(), 1 + 255 + 1 + 1);
        assert_eq!(packed[0], 255);
        assert_eq!(&packed[1..256], long.as_bytes());
        assert_eq!(&packed[256..], [1, b'a']);
        assert!(pack_keys(&[]).is_empty());
    }
}
