//! The register: a fenced counter on a loopback TCP port of the checker process,
//! independent of the store, through which every worker reports what it does.
//!
//! One line per request, one line per answer; a worker waits for the answer before it goes
//! on, so each event's time (the checker's monotonic clock, taken under the register's lock
//! when the request is handled) lies between the worker's sending and its next step.
//!
//! | request | answer | recorded |
//! |---|---|---|
//! | `HELLO w` | `OK` | (the connection belongs to worker `w`) |
//! | `LIFELINE` | none | nothing: the worker exits when this connection closes |
//! | `INVOKE` | `OK` | [`EventKind::Invoke`] |
//! | `ACQUIRED t [w c]` | `OK` | [`EventKind::Acquired`] (a claim of weight `w` of capacity `c`; the whole key without them) |
//! | `FAILED msg` | `OK` | [`EventKind::AcquireFailed`] |
//! | `READ t` | `VALUE v`, `VALUE v STALL ms` or `REJECTED h` | [`EventKind::Read`] (`STALL`: the nemesis asks the reader to wait `ms` before it writes) |
//! | `WRITE t v` | `OK` or `REJECTED h` | [`EventKind::Write`] |
//! | `LOST US` | `OK` | [`EventKind::Lost`] (`lost()` fired US µs before) |
//! | `RELEASE` | `OK` | [`EventKind::ReleaseInvoked`] |
//! | `RELEASED outcome` | `OK` | [`EventKind::Released`] |
//!
//! The register refuses a read or write whose token is below the highest it has seen (and
//! accepts equal ones: a holder's repeated operations), like
//! [`FencedResource`](lockcore::FencedResource).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::Claim;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::event::{Event, EventKind, WorkerId};

/// The register and the history it records.
pub(crate) struct Register {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct Shared {
    start: Instant,
    state: Mutex<State>,
    /// The number of events recorded, for waiting on a new one.
    count: watch::Sender<usize>,
}

#[derive(Default)]
struct State {
    events: Vec<Event>,
    highest: Option<u64>,
    value: u64,
    /// How long the next accepted read is asked to wait before its write.
    stall: Option<Duration>,
}

impl Shared {
    /// Records an event (under the lock, so times and order agree) and returns the answer
    /// `answer` computes from the register's state.
    fn record<R>(&self, f: impl FnOnce(&mut State) -> (EventKind, R)) -> R {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (kind, answer) = f(&mut state);
        let at = self.start.elapsed();
        state.events.push(Event { at, kind });
        let n = state.events.len();
        drop(state);
        self.count.send_replace(n);
        answer
    }
}

impl Register {
    /// Starts the register on a free loopback port.
    pub(crate) async fn start() -> std::io::Result<Register> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            start: Instant::now(),
            state: Mutex::new(State::default()),
            count: watch::channel(0).0,
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, shared.clone(), stop.clone()));
        Ok(Register { addr, shared, stop })
    }

    /// Where workers connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Records what the nemesis (or the run) does.
    pub(crate) fn record(&self, kind: EventKind) {
        self.shared.record(|_| (kind, ()));
    }

    /// Asks the next accepted read to wait `stall` before its write, and returns how many
    /// events are recorded so far: the first accepted [`EventKind::Read`] from there on is
    /// the stalled one.
    pub(crate) fn stall_next_read(&self, stall: Duration) -> usize {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.stall = Some(stall);
        state.events.len()
    }

    /// Withdraws a stall no read has taken.
    pub(crate) fn clear_stall(&self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stall = None;
    }

    /// How many events are recorded so far.
    pub(crate) fn len(&self) -> usize {
        *self.shared.count.borrow()
    }

    /// The first event from index `from` on that `pred` accepts, waiting up to `within`
    /// for it to be recorded.
    pub(crate) async fn wait_for(
        &self,
        from: usize,
        within: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> Option<Event> {
        let mut count = self.shared.count.subscribe();
        let mut seen = from;
        let search = async {
            loop {
                {
                    let state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(e) = state.events.iter().skip(seen).find(|e| pred(e)) {
                        return Some(e.clone());
                    }
                    seen = state.events.len().max(seen);
                }
                if count.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(within, search).await.ok().flatten()
    }

    /// Stops the register: every worker connection closes (the workers exit), and the
    /// history is handed over.
    pub(crate) fn finish(self) -> Vec<Event> {
        self.stop.cancel();
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut state.events)
    }
}

impl Drop for Register {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        if let Ok((stream, _)) = accepted {
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(stream, shared.clone(), stop.clone()));
        }
    }
}

async fn serve(stream: TcpStream, shared: Arc<Shared>, stop: CancellationToken) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut worker: Option<WorkerId> = None;
    loop {
        let line = tokio::select! {
            _ = stop.cancelled() => return,
            l = lines.next_line() => l,
        };
        let line = match line {
            Ok(Some(line)) => line,
            _ => break,
        };
        let answer = match (worker, line.split_once(' ')) {
            (None, _) if line == "LIFELINE" => None,
            (None, Some(("HELLO", w))) => match w.parse() {
                Ok(w) => {
                    worker = Some(w);
                    Some("OK".to_owned())
                }
                Err(_) => Some("ERR bad worker id".to_owned()),
            },
            (None, _) => Some("ERR say HELLO first".to_owned()),
            (Some(w), _) => Some(handle(&shared, w, &line)),
        };
        if let Some(answer) = answer {
            if write
                .write_all(format!("{answer}\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
    }
    if let Some(worker) = worker {
        if !stop.is_cancelled() {
            shared.record(|_| (EventKind::Gone { worker }, ()));
        }
    }
}

/// Handles one request of worker `w`, returning the answer line.
fn handle(shared: &Shared, worker: WorkerId, line: &str) -> String {
    let mut words = line.splitn(3, ' ');
    let verb = words.next().unwrap_or("");
    let a = words.next();
    let b = words.next();
    let num = |s: Option<&str>| s.and_then(|s| s.parse::<u64>().ok());
    let ok = |kind: EventKind| {
        shared.record(|_| (kind, ()));
        "OK".to_owned()
    };
    let text = || line.split_once(' ').map_or("", |(_, t)| t).to_owned();
    match (verb, num(a), num(b)) {
        ("INVOKE", _, _) => ok(EventKind::Invoke { worker }),
        ("ACQUIRED", Some(token), _) => {
            let claim = match b.map(|b| b.split_once(' ')) {
                None => Some(Claim::exclusive()),
                Some(Some((w, c))) => match (w.parse(), c.parse()) {
                    (Ok(w), Ok(c)) => Claim::from_parts(w, c),
                    _ => None,
                },
                Some(None) => None,
            };
            match claim {
                Some(claim) => ok(EventKind::Acquired {
                    worker,
                    token,
                    claim,
                }),
                None => format!("ERR no claim in {line:?}"),
            }
        }
        ("FAILED", _, _) => ok(EventKind::AcquireFailed {
            worker,
            error: text(),
        }),
        ("LOST", ago, _) => ok(EventKind::Lost {
            worker,
            ago: Duration::from_micros(ago.unwrap_or(0)),
        }),
        ("RELEASE", _, _) => ok(EventKind::ReleaseInvoked { worker }),
        ("RELEASED", _, _) => ok(EventKind::Released {
            worker,
            outcome: text(),
        }),
        ("READ", Some(token), _) => shared.record(|s| {
            let outcome = match s.highest {
                Some(h) if token < h => Err(h),
                _ => {
                    s.highest = Some(token);
                    Ok(s.value)
                }
            };
            let answer = match (outcome, outcome.is_ok().then(|| s.stall.take()).flatten()) {
                (Ok(v), Some(stall)) => format!("VALUE {v} STALL {}", stall.as_millis()),
                (Ok(v), None) => format!("VALUE {v}"),
                (Err(h), _) => format!("REJECTED {h}"),
            };
            (
                EventKind::Read {
                    worker,
                    token,
                    outcome,
                },
                answer,
            )
        }),
        ("WRITE", Some(token), Some(value)) => shared.record(|s| {
            let (accepted, answer) = match s.highest {
                Some(h) if token < h => (false, format!("REJECTED {h}")),
                _ => {
                    s.highest = Some(token);
                    s.value = value;
                    (true, "OK".to_owned())
                }
            };
            (
                EventKind::Write {
                    worker,
                    token,
                    value,
                    accepted,
                },
                answer,
            )
        }),
        _ => format!("ERR cannot parse {line:?}"),
    }
}
