//! Tasks that contend for one key through a failover: each takes the lock, writes its token
//! to a fenced register, and gives it back, over and over, retrying what fails meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockcore::{FencedResource, FencingToken, LockClient, LockError};
use tokio::task::JoinHandle;

/// The contending tasks and what they share.
pub struct Contenders {
    register: Arc<FencedResource<u64>>,
    stop: Arc<AtomicBool>,
    /// Milliseconds from `epoch` to the last grant.
    last_grant_ms: Arc<AtomicU64>,
    epoch: tokio::time::Instant,
    tasks: Vec<JoinHandle<(u32, Vec<FencingToken>)>>,
}

/// What the contenders saw, once stopped.
pub struct Outcome {
    /// Grants whose token the register refused (lower than one it had seen).
    pub stale: u32,
    /// Grants with a token above `above`.
    pub above: usize,
}

impl Contenders {
    /// One task per client on `key` (2 s TTL, 1 s wait per try).
    pub fn start(clients: Vec<LockClient>, key: &'static str) -> Self {
        let register = Arc::new(FencedResource::new(0u64));
        let stop = Arc::new(AtomicBool::new(false));
        let last_grant_ms = Arc::new(AtomicU64::new(0));
        let epoch = tokio::time::Instant::now();
        let tasks = clients
            .into_iter()
            .map(|locks| {
                let (register, stop, last_grant_ms) =
                    (register.clone(), stop.clone(), last_grant_ms.clone());
                tokio::spawn(async move {
                    let mut stale = 0u32;
                    let mut tokens = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let attempt = locks
                            .lock(key)
                            .ttl(Duration::from_secs(2))
                            .wait(Duration::from_secs(1))
                            .acquire()
                            .await;
                        match attempt {
                            Ok(guard) => {
                                last_grant_ms
                                    .store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                                if register.write(guard.token(), |n| *n += 1).is_err() {
                                    stale += 1;
                                }
                                tokens.push(guard.token());
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                let _ = guard.release().await;
                            }
                            Err(e) => {
                                assert!(
                                    e.is_retryable() || matches!(e, LockError::Timeout { .. }),
                                    "{}",
                                    lockcore::ErrorChain(&e)
                                );
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                    (stale, tokens)
                })
            })
            .collect();
        Contenders {
            register,
            stop,
            last_grant_ms,
            epoch,
            tasks,
        }
    }

    /// The highest token the register accepted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        self.register.highest()
    }

    /// Milliseconds since the contenders started.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Waits (at most 20 s) for a grant later than `since_ms` + 100 ms; how long after
    /// `since_ms` it came.
    pub async fn grant_after(&self, since_ms: u64) -> Duration {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while self.last_grant_ms.load(Ordering::Relaxed) <= since_ms + 100 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no grant within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Duration::from_millis(self.last_grant_ms.load(Ordering::Relaxed) - since_ms)
    }

    /// Stops the tasks; what they saw, counting grants above `above`.
    pub async fn stop(self, above: FencingToken) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        let mut outcome = Outcome { stale: 0, above: 0 };
        for task in self.tasks {
            let (stale, tokens) = task.await.unwrap();
            outcome.stale += stale;
            outcome.above += tokens.iter().filter(|t| **t > above).count();
        }
        outcome
    }
}
