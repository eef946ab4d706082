use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Clients take overlapping sets of keys (`lock_all`), each set a read-modify-write of
/// every key in it with an `.await` between read and write: no update is lost and no key
/// is ever inside two sets at once.
pub async fn key_sets_all_or_nothing(h: Arc<dyn Harness>) -> Outcome {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 6;
    let keys = Keys::new();
    let ttl = h.ttl() * 20;
    let names: Vec<String> = (0..4).map(|i| keys.key(&format!("acct-{i}"))).collect();
    // Pairs and a triple, given in either order.
    let sets: [&[usize]; 4] = [&[0, 1], &[2, 1, 0], &[3, 2], &[1, 3]];
    let values: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let mut expected = [0u64; 4];
    for (n, client) in clients(&*h, CLIENTS).await?.into_iter().enumerate() {
        let picks: Vec<Vec<usize>> = (0..ROUNDS).map(|r| sets[(n + r) % 4].to_vec()).collect();
        for pick in &picks {
            for &i in pick {
                expected[i] += 1;
            }
        }
        let (names, values, inside, overlaps) = (
            names.clone(),
            values.clone(),
            inside.clone(),
            overlaps.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for pick in picks {
                let set = client
                    .lock_all(pick.iter().map(|&i| names[i].clone()))
                    .ttl(ttl)
                    .wait(ttl * 10)
                    .acquire()
                    .await?;
                for &i in &pick {
                    if inside[i].fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let read: Vec<u64> = pick
                    .iter()
                    .map(|&i| values[i].load(Ordering::SeqCst))
                    .collect();
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
                for (&i, v) in pick.iter().zip(read) {
                    values[i].store(v + 1, Ordering::SeqCst);
                    inside[i].fetch_sub(1, Ordering::SeqCst);
                }
                set.release().await?;
            }
            Ok::<(), lockcore::LockError>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure(format!("task panicked: {e}")))??;
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    check!(
        overlaps == 0,
        "{overlaps} times a key was inside two sets at once"
    );
    let got: Vec<u64> = values.iter().map(|v| v.load(Ordering::SeqCst)).collect();
    check!(
        got == expected,
        "lost updates: the keys' counters are {got:?}, expected {expected:?}"
    );
    Ok(())
}
