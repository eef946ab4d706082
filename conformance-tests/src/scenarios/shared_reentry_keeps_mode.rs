use std::sync::Arc;

use lockcore::{ClaimMode, ReleaseOutcome};

use crate::scenarios::{clients, config_error, writer_fits, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Re-entry keeps the mode: the same owner re-enters a shared hold with the same token (the
/// store still sees one lease) and releases count down; asking exclusive while holding
/// shared, or shared while holding exclusive (or other permits of a semaphore), is a
/// configuration error that leaves the hold as it was. (The semaphore part runs when the
/// backend declares semaphores.)
pub async fn shared_reentry_keeps_mode(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl() * 10;
    let c = clients(&*h, 2).await?;
    let probe = c[1].new_owner();

    let key = keys.key("reader");
    let owner = c[0].new_owner();
    let read = || c[0].lock(&key).shared().ttl(ttl).owner(owner.clone());
    let g1 = read().acquire().await?;
    let g2 = read().acquire().await?;
    let Some(g3) = read().try_acquire().await? else {
        return Err(Failure("re-entry by the reader was refused".into()));
    };
    check!(
        g1.token() == g2.token() && g2.token() == g3.token(),
        "re-entry changed the token: {} {} {}",
        g1.token(),
        g2.token(),
        g3.token()
    );
    check!(
        g3.claim().mode() == ClaimMode::Shared,
        "the re-entered hold shows mode {}",
        g3.claim().mode()
    );
    let leases = c[1].inspect_all(&key).await?;
    check!(
        leases.len() == 1 && leases[0].token == g1.token(),
        "three holds of one owner show as {leases:?}"
    );
    config_error(
        "an exclusive lock by an owner holding the key shared",
        c[0].lock(&key)
            .ttl(ttl)
            .owner(owner.clone())
            .try_acquire()
            .await,
    )?;
    let r3 = g3.release().await?;
    check!(
        r3 == ReleaseOutcome::StillHeld { holds: 2 },
        "first release of three answered {r3:?}"
    );
    let r2 = g2.release().await?;
    check!(
        r2 == ReleaseOutcome::StillHeld { holds: 1 },
        "second release of three answered {r2:?}"
    );
    check!(
        !writer_fits(&c[1], &key, ttl, &probe).await?,
        "a writer got in before the reader's last release"
    );
    let r1 = g1.release().await?;
    check!(
        r1 == ReleaseOutcome::Released,
        "the last release answered {r1:?}"
    );
    check!(
        writer_fits(&c[1], &key, ttl, &probe).await?,
        "a writer was refused after the reader's last release"
    );

    let key = keys.key("writer");
    let owner = c[0].new_owner();
    let w = c[0]
        .lock(&key)
        .ttl(ttl)
        .owner(owner.clone())
        .acquire()
        .await?;
    config_error(
        "a shared lock by an owner holding the key exclusively",
        c[0].lock(&key)
            .shared()
            .ttl(ttl)
            .owner(owner.clone())
            .try_acquire()
            .await,
    )?;
    let again = c[0].lock(&key).ttl(ttl).owner(owner).acquire().await?;
    check!(
        again.token() == w.token() && again.claim().mode() == ClaimMode::Exclusive,
        "the writer's re-entry after a refused shared request changed its hold"
    );
    again.release().await?;
    check!(
        w.release().await? == ReleaseOutcome::Released,
        "the writer's last release did not free the key"
    );

    if c[0].capabilities().semaphores {
        let key = keys.key("semaphore");
        let owner = c[0].new_owner();
        let sem = |permits| {
            c[0].semaphore(&key, 3)
                .permits(permits)
                .ttl(ttl)
                .owner(owner.clone())
        };
        let a = sem(2).acquire().await?;
        let b = sem(2).acquire().await?;
        check!(
            a.token() == b.token(),
            "a semaphore holder's re-entry changed the token"
        );
        let held: Vec<_> = c[1]
            .inspect_all(&key)
            .await?
            .iter()
            .map(|i| i.claim.semaphore_permits())
            .collect();
        check!(
            held == [Some(2)],
            "two holds of 2 permits by one owner show as {held:?}"
        );
        config_error(
            "1 permit by an owner holding 2 of the semaphore",
            sem(1).try_acquire().await,
        )?;
        b.release().await?;
        check!(
            a.release().await? == ReleaseOutcome::Released,
            "the semaphore holder's last release did not free its permits"
        );
    }
    Ok(())
}
