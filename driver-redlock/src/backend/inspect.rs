//! Inspecting: every instance's view of a key (a survey), the holder seen on a majority,
//! and the shared leases seen on a majority.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use driver_redis::__redlock as support;
use driver_redis::redis::{FromRedisValue, ScriptInvocation, Value};
use lockcore::{Claim, FencingToken, LockError, LockInfo, LockKey};

use crate::fencing::common_token;
use crate::quorum::time_until_at_most;
use crate::rounds::Failures;
use crate::store::Inner;

/// One instance's copy of a lease: what it shows, and whether it carries the written-back
/// token.
type Copy = (LockInfo, bool);

/// One instance's view of a key: `None` when free, else the holder's owner (hex) and copy.
type Seen = Option<(String, Copy)>;

fn parse_inspect(reply: &[Value]) -> Result<Seen, LockError> {
    match reply {
        [] => Ok(None),
        [Value::BulkString(value), pttl] => {
            let (token, label) =
                support::parse_value(value).ok_or_else(|| support::unexpected("lock value"))?;
            let owner = value
                .get(..32)
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            // The fencing write-back stores T as `0T` (a grant's own token never starts
            // with `0`); an unfenced lock's token is `0` itself, settled from the start.
            let written_back = value.get(33) == Some(&b'0');
            let remaining = support::as_int(pttl).and_then(support::remaining);
            let copy = (LockInfo::new(label, token, remaining), written_back);
            Ok(Some((owner.into_owned(), copy)))
        }
        _ => Err(support::unexpected("inspect reply")),
    }
}

impl Inner {
    /// Every instance's view of a key by the script `inv` (read by `parse`), stopping once
    /// `enough` says the rest cannot change the answer. With `marks` (the script marks the
    /// copies it finds), the requests not awaited finish in the background; otherwise they
    /// are dropped.
    pub(crate) async fn survey<T, S>(
        self: &Arc<Self>,
        (what, inv, marks): (&'static str, ScriptInvocation<'static>, bool),
        parse: impl Fn(T) -> Result<S, LockError>,
        enough: impl Fn(&[S], usize) -> bool,
    ) -> (Vec<S>, Failures)
    where
        T: FromRedisValue + Send + 'static,
    {
        let timeout = self.untimed();
        let mut pending = self.round(what, timeout, inv, |_| true);
        let mut seen = Vec::with_capacity(self.instances.len());
        let mut failures = Failures::default();
        while let Some((i, r)) = pending.next().await {
            match r.and_then(&parse) {
                Ok(s) => seen.push(s),
                Err(e) => {
                    tracing::debug!(instance = %self.instances[i].label, error = %lockcore::ErrorChain(&e), "redlock {what} failed on an instance");
                    failures.add(&self.instances[i].label, e);
                }
            }
            if enough(&seen, pending.len()) {
                break;
            }
        }
        if marks {
            // The rest mark their copies too, in the background: the more of the holder's
            // copies are marked, the likelier its release reaches a majority of
            // announcements (see `release_filter`).
            pending.detach();
        }
        // Reads only otherwise: the unanswered ones can simply be dropped.
        (seen, failures)
    }

    /// The holder a majority of instances agree on, or `None` when no majority can hold
    /// `key`.
    pub(crate) async fn inspect(
        self: &Arc<Self>,
        key: &LockKey,
    ) -> Result<Option<LockInfo>, LockError> {
        let mut attempt = 0;
        loop {
            match self.inspect_once(key).await? {
                Inspected::Settled(info) => return Ok(info),
                // The holder's copies disagree on the token: its acquisition is between the
                // grants and the write-back of T. Look again shortly rather than report a
                // token the holder will not have.
                Inspected::Unsettled(info) if attempt < UNSETTLED_RETRIES.len() => {
                    tokio::time::sleep(UNSETTLED_RETRIES[attempt]).await;
                    attempt += 1;
                    tracing::trace!(
                        token = info.token.0,
                        "redlock inspect: token not settled yet"
                    );
                }
                Inspected::Unsettled(info) => return Ok(Some(info)),
            }
        }
    }

    /// One survey of `key`: see [`inspect`](Self::inspect).
    async fn inspect_once(self: &Arc<Self>, key: &LockKey) -> Result<Inspected, LockError> {
        let (q, n) = (self.quorum, self.instances.len());
        let largest_group = |seen: &[Seen]| -> usize {
            let mut groups: HashMap<&str, usize> = HashMap::new();
            for (owner, ..) in seen.iter().flatten() {
                *groups.entry(owner.as_str()).or_default() += 1;
            }
            groups.into_values().max().unwrap_or(0)
        };
        let names = support::names(&self.prefix, key);
        let (seen, failures) = self
            .survey(
                ("inspect", support::INSPECT.key(&names.lock), false),
                |reply: Vec<Value>| parse_inspect(&reply),
                // Every answer counts for a held key: the lease lasts while a majority keeps
                // a copy, so one instance not heard from may hold the copy that decides how
                // long (a same-owner re-grant with a shorter TTL leaves short copies where
                // the first grant never reached). Only "free" can be told early: when no
                // owner can reach a majority, whatever the rest answer.
                |seen, pending| {
                    pending == 0 || (largest_group(seen) + pending < q && seen.len() >= q)
                },
            )
            .await;
        let mut groups: HashMap<&str, Vec<Copy>> = HashMap::new();
        for (owner, copy) in seen.iter().flatten() {
            groups.entry(owner.as_str()).or_default().push(copy.clone());
        }
        if let Some(group) = groups.into_values().find(|g| g.len() >= q) {
            let (info, settled) = merge(&group, q, Claim::exclusive())?;
            return Ok(if settled {
                Inspected::Settled(Some(info))
            } else {
                Inspected::Unsettled(info)
            });
        }
        // "Free" only when no majority could hold it even if every instance that did not
        // answer held it; otherwise the answer is unknown, not "free".
        let unanswered = n - seen.len();
        if seen.len() < q || largest_group(&seen) + unanswered >= q {
            return Err(self.too_few(seen.len(), failures));
        }
        Ok(Inspected::Settled(None))
    }
}

/// What one survey of a key found.
enum Inspected {
    /// Free, or held with a token a majority of the holder's copies carry.
    Settled(Option<LockInfo>),
    /// Held by an owner whose copies carry no majority token yet.
    Unsettled(LockInfo),
}

/// The pauses before looking again at a holder whose token is not settled: its write-back
/// takes one round trip, which on a loaded machine can take tens of milliseconds (27 ms in
/// all was seen to fall short under the whole test suite's load); ~180 ms in all, paid only
/// while an acquisition is between its grants and its write-back.
const UNSETTLED_RETRIES: [Duration; 5] = [
    Duration::from_millis(2),
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(50),
    Duration::from_millis(100),
];

impl Inner {
    /// Every lease a majority holds: the exclusive holder's and each shared lease, grouped
    /// by owner across the instances (the owner token stays inside this function), with
    /// the token most written-back copies carry (failing any, the token most copies carry),
    /// in token order.
    ///
    /// # Errors
    ///
    /// [`LockError::QuorumNotReached`] when fewer than a majority answered, or when a lease
    /// seen on fewer than a majority could still have one on the instances that did not.
    pub(crate) async fn inspect_all(
        self: &Arc<Self>,
        key: &LockKey,
    ) -> Result<Vec<LockInfo>, LockError> {
        let names = support::names(&self.prefix, key);
        let inv = names.call(&support::INSPECT_ALL);
        let (seen, failures) = self
            .survey(
                ("inspect all", inv, false),
                |reply: Vec<Vec<Value>>| {
                    reply
                        .iter()
                        .map(|l| {
                            let written_back = l.get(2).is_some_and(support::written_back);
                            support::lease_owner(l)
                                .zip(support::inspected(l))
                                .map(|(owner, lease)| (owner, (lease, written_back)))
                                .ok_or_else(|| support::unexpected("lease"))
                        })
                        .collect::<Result<Vec<(String, (LockInfo, bool))>, LockError>>()
                },
                |_, pending| pending == 0,
            )
            .await;
        let q = self.quorum;
        if seen.len() < q {
            return Err(self.too_few(seen.len(), failures));
        }
        let answered = seen.len();
        let mut copies: HashMap<(String, Claim), Vec<Copy>> = HashMap::new();
        for (owner, (lease, written_back)) in seen.into_iter().flatten() {
            copies
                .entry((owner, lease.claim))
                .or_default()
                .push((lease, written_back));
        }
        // A lease seen on fewer than a majority that the instances which did not answer
        // could complete is neither held nor free for all we know: unknown, as in
        // `inspect_once`.
        let unanswered = self.instances.len() - answered;
        if copies
            .values()
            .any(|g| g.len() < q && g.len() + unanswered >= q)
        {
            return Err(self.too_few(answered, failures));
        }
        let mut leases = Vec::new();
        for ((_, claim), group) in copies.into_iter().filter(|(_, g)| g.len() >= q) {
            leases.push(merge(&group, q, claim)?.0);
        }
        leases.sort_by_key(|l| l.token);
        Ok(leases)
    }
}

/// The lease that one owner's copies on at least `q` instances make, and whether it is
/// settled (`q` of them carry its token written back). Its token is the written-back T (a
/// copy granted late carries its own token, unmarked, and may even tie with T when an
/// instance does not answer), failing any the commonest; its label that of a copy
/// carrying the token; it is held while a majority holds it: until all but `q − 1` of
/// its copies expired.
fn merge(copies: &[Copy], q: usize, claim: Claim) -> Result<(LockInfo, bool), LockError> {
    let written: Vec<FencingToken> = copies.iter().filter(|c| c.1).map(|c| c.0.token).collect();
    let tokens: Vec<FencingToken> = copies.iter().map(|c| c.0.token).collect();
    let token = common_token(&written)
        .or_else(|| common_token(&tokens))
        .ok_or_else(|| support::unexpected("inspect tokens"))?;
    let label = copies
        .iter()
        .find(|c| c.0.token == token)
        .map(|c| c.0.holder.clone())
        .unwrap_or_default();
    let remaining = time_until_at_most(copies.iter().map(|c| c.0.remaining_ttl).collect(), q - 1);
    let settled = written.iter().filter(|t| **t == token).count() >= q;
    Ok((
        LockInfo::new(label, token, remaining).with_claim(claim),
        settled,
    ))
}
