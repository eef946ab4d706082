use std::sync::Arc;

use lockcore::driver::{ExtendOutcome, Renewal, RENEWAL_BATCH};
use lockcore::{LockGuard, LockKey, Owner};

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A renewal batch as large as the watchdog sends ([`RENEWAL_BATCH`]) goes through whole —
/// a store's limits on a statement's terms or parameters, or a script's arguments, are the
/// driver's to split around — and answers each renewal in order: a held lock `Extended`
/// with its holder's token; an owner that holds nothing `NotHeld`, on a free key as on a
/// key another owner holds, and the free key stays free.
pub async fn full_renewal_batch_answers_each(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 1).await?;
    let client = &c[0];
    let mine = Owner::new("batch-holder");
    let stranger = Owner::new("batch-stranger");
    let names: Vec<String> = (0..RENEWAL_BATCH)
        .map(|i| keys.key(&format!("full-{i}")))
        .collect();
    // Renewal `i` is by the holder of key `i` when `i` is a multiple of `HELD`; by a
    // stranger on the key just before it when one more; by a stranger on a free key
    // otherwise.
    let kind = |i: usize| match i % HELD {
        0 => Kind::Holder,
        1 => Kind::StrangerOnHeld,
        _ => Kind::StrangerOnFree,
    };
    let mut guards: Vec<Option<LockGuard>> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        guards.push(match kind(i) {
            Kind::Holder => Some(
                client
                    .lock(name.as_str())
                    .owner(mine.clone())
                    .ttl(ttl)
                    .acquire()
                    .await?,
            ),
            _ => None,
        });
    }
    let lock_keys = (0..RENEWAL_BATCH)
        .map(|i| match kind(i) {
            Kind::StrangerOnHeld => LockKey::new(names[i - 1].as_str()),
            _ => LockKey::new(names[i].as_str()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let renewals: Vec<Renewal<'_>> = lock_keys
        .iter()
        .enumerate()
        .map(|(i, k)| match kind(i) {
            Kind::Holder => Renewal::new(k, &mine, ttl),
            _ => Renewal::new(k, &stranger, ttl),
        })
        .collect();
    let answers = client.backend().renew(&renewals).await?;
    check!(
        answers.len() == renewals.len(),
        "a batch of {} renewals answered {} outcomes",
        renewals.len(),
        answers.len()
    );
    for (i, answer) in answers.into_iter().enumerate() {
        let key = lock_keys[i].as_str();
        match (kind(i), answer, &guards[i]) {
            (Kind::StrangerOnHeld | Kind::StrangerOnFree, Ok(ExtendOutcome::NotHeld), _) => {}
            (Kind::Holder, Ok(ExtendOutcome::Extended(grant)), Some(g)) => {
                check!(
                    grant.token == g.token(),
                    "renewal {i} of a batch ({key:?}) answered token {}, its holder's is {}",
                    grant.token,
                    g.token()
                );
            }
            (kind, other, _) => {
                return Err(Failure(format!(
                    "renewal {i} of a batch of {} ({key:?}, {}) answered {other:?}",
                    renewals.len(),
                    kind.what()
                )))
            }
        }
    }
    for i in (0..RENEWAL_BATCH)
        .filter(|&i| kind(i) == Kind::StrangerOnFree)
        .step_by(97)
    {
        check!(
            client.inspect(lock_keys[i].as_str()).await?.is_none(),
            "a stranger's renewal in a batch took the free key {:?}",
            lock_keys[i].as_str()
        );
    }
    for g in guards.into_iter().flatten() {
        g.release().await?;
    }
    Ok(())
}

/// Every how manyth key of the batch is held.
const HELD: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Holder,
    StrangerOnHeld,
    StrangerOnFree,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Holder => "by its holder",
            Kind::StrangerOnHeld => "by an owner that holds nothing, on a held key",
            Kind::StrangerOnFree => "by an owner that holds nothing, on a free key",
        }
    }
}
