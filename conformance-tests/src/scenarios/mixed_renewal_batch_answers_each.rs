use std::sync::Arc;

use lockcore::driver::{ExtendOutcome, Renewal};
use lockcore::{LockGuard, LockKey};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A renewal batch carries exclusive holds and shared leases together (the watchdog
/// batches whatever falls due at once, whatever its mode), and answers each in its place:
/// a held lock or a live read lease `Extended` with its own token, a renewal by an owner
/// that holds no lease on a read-locked key `NotHeld`. (A driver that renews leases by
/// another path than locks must put their answers back where their renewals were.)
pub async fn mixed_renewal_batch_answers_each(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let mine = c[0].new_owner();
    let stranger = c[1].new_owner();
    let kind = |i: usize| KINDS[i % KINDS.len()];
    let names: Vec<String> = (0..RENEWALS)
        .map(|i| keys.key(&format!("mixed-{i}")))
        .collect();
    let mut guards: Vec<Option<LockGuard>> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let lock = c[0].lock(name.as_str()).owner(mine.clone()).ttl(ttl);
        guards.push(match kind(i) {
            Kind::Exclusive => Some(lock.acquire().await?),
            Kind::Shared => Some(lock.shared().acquire().await?),
            Kind::StrangerOnShared => {
                // Read-locked by someone else: the stranger has no lease there.
                let other = c[1].lock(name.as_str()).shared().ttl(ttl).acquire().await?;
                Some(other)
            }
        });
    }
    let lock_keys = names
        .iter()
        .map(|n| LockKey::new(n.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    let renewals: Vec<Renewal<'_>> = lock_keys
        .iter()
        .enumerate()
        .map(|(i, k)| match kind(i) {
            Kind::StrangerOnShared => Renewal::new(k, &stranger, ttl),
            _ => Renewal::new(k, &mine, ttl),
        })
        .collect();
    let answers = c[0].backend().renew(&renewals).await?;
    check!(
        answers.len() == renewals.len(),
        "a batch of {} renewals answered {} outcomes",
        renewals.len(),
        answers.len()
    );
    for (i, answer) in answers.into_iter().enumerate() {
        let key = lock_keys[i].as_str();
        match (kind(i), answer, &guards[i]) {
            (Kind::StrangerOnShared, Ok(ExtendOutcome::NotHeld), _) => {}
            (Kind::Exclusive | Kind::Shared, Ok(ExtendOutcome::Extended(grant)), Some(g)) => {
                check!(
                    grant.token == g.token(),
                    "renewal {i} of a mixed batch ({key:?}, {}) answered token {}, the \
                     renewed hold's is {}",
                    kind(i).what(),
                    grant.token,
                    g.token()
                );
            }
            (kind, other, _) => {
                return Err(Failure(format!(
                    "renewal {i} of a mixed batch of {} ({key:?}, {}) answered {other:?}",
                    renewals.len(),
                    kind.what()
                )))
            }
        }
    }
    for g in guards.into_iter().flatten() {
        g.release().await?;
    }
    Ok(())
}

/// Renewals in the batch.
const RENEWALS: usize = 24;

/// The kinds in turn: leases between locks, so that a lease's answer put in another
/// lease's place or a lock's shows.
const KINDS: [Kind; 5] = [
    Kind::Exclusive,
    Kind::Shared,
    Kind::Shared,
    Kind::StrangerOnShared,
    Kind::Shared,
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Shared,
    StrangerOnShared,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Exclusive => "its holder's exclusive lock",
            Kind::Shared => "its holder's read lease",
            Kind::StrangerOnShared => "by an owner without a lease, on a read-locked key",
        }
    }
}
