//! Who holds a lock: a secret token and a public label.

use std::fmt;
use std::sync::Arc;

/// Owner tokens are cut from the operating system's CSPRNG output, fetched for 32 tokens
/// at a time per thread: one `getrandom` call per 32 acquisitions instead of one each,
/// because the system call and the kernel's per-call ChaCha setup are a visible share of
/// an acquisition's CPU when the store is in memory (lockbench `memory --case
/// uncontended`). The bytes are exactly as
/// unpredictable as a call per token; each is used once and wiped when taken. A forked child
/// never reuses its parent's bytes: the pool remembers the process it was filled in and is
/// refilled in any other.
mod pool {
    use std::cell::RefCell;

    /// Tokens per fetch.
    pub(super) const TOKENS: usize = 32;

    struct Pool {
        pid: u32,
        bytes: [u8; 16 * TOKENS],
        /// Tokens of `bytes` already handed out.
        used: usize,
    }

    thread_local! {
        static POOL: RefCell<Pool> = const {
            RefCell::new(Pool { pid: 0, bytes: [0; 16 * TOKENS], used: TOKENS })
        };
    }

    /// 16 fresh random bytes.
    pub(super) fn take() -> [u8; 16] {
        POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let pid = std::process::id();
            if pool.used == TOKENS || pool.pid != pid {
                #[allow(clippy::expect_used)]
                getrandom::fill(&mut pool.bytes)
                    .expect("the operating system's CSPRNG is unavailable");
                pool.pid = pid;
                pool.used = 0;
            }
            let at = pool.used * 16;
            pool.used += 1;
            let mut token = [0u8; 16];
            token.copy_from_slice(&pool.bytes[at..at + 16]);
            pool.bytes[at..at + 16].fill(0);
            token
        })
    }
}

/// The longest owner label kept, in bytes; longer labels are cut at a character boundary.
pub const MAX_LABEL_LEN: usize = 255;

/// A 128-bit secret drawn from the operating system's CSPRNG.
///
/// The token is the only thing a backend trusts for release and extend. It never appears in
/// `Debug` output, [`LockInfo`](crate::LockInfo), logs or the CLI.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// A fresh random token.
    ///
    /// # Panics
    ///
    /// Only if the operating system has no entropy source at all (as `rand::random` does);
    /// a predictable token would be worse than no lock.
    pub fn generate() -> Self {
        OwnerToken(pool::take())
    }

    /// Rebuilds a token from its bytes (for backends that store it in binary form).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        OwnerToken(bytes)
    }

    /// The raw bytes, for storing in a backend.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The token as 32 lowercase hex digits, for storing in a text-valued backend.
    pub fn to_hex(&self) -> String {
        // Always ASCII; the fallback is unreachable.
        String::from_utf8(self.hex_digits().to_vec()).unwrap_or_default()
    }

    /// [`to_hex`](Self::to_hex) without an allocation: the 32 ASCII digits, for a backend
    /// that writes many tokens into one request.
    ///
    /// # Examples
    ///
    /// ```
    /// let token = distlock_core::driver::OwnerToken::from_bytes([0xab; 16]);
    /// assert_eq!(&token.hex_digits()[..], token.to_hex().as_bytes());
    /// ```
    pub fn hex_digits(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            hex[2 * i] = DIGITS[usize::from(b >> 4)];
            hex[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
        }
        hex
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(<redacted>)")
    }
}

/// Who holds a lock: a secret [`OwnerToken`] and a human-readable label.
///
/// Every acquisition gets a fresh owner unless the caller passes its own through
/// [`LockRequest::owner`](crate::LockRequest::owner) to re-enter a lock it already holds
/// through the same [`LockClient`](crate::LockClient). An owner belongs to one client.
///
/// # Examples
///
/// ```
/// use distlock_core::Owner;
///
/// let owner = Owner::new("report-service/node-2");
/// assert_eq!(owner.label(), "report-service/node-2");
/// assert!(!format!("{owner:?}").contains(&owner.token().to_hex()));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    token: OwnerToken,
    label: Arc<str>,
}

impl Owner {
    /// A new owner with a fresh random token and the given label.
    ///
    /// Control characters in the label are replaced by `?` and it is cut to
    /// [`MAX_LABEL_LEN`] bytes, so a label can always be shown and stored.
    pub fn new(label: impl AsRef<str>) -> Self {
        Owner::with_token(OwnerToken::generate(), label)
    }

    /// An owner with a known token, e.g. one a backend read back from the store.
    pub fn with_token(token: OwnerToken, label: impl AsRef<str>) -> Self {
        Owner {
            token,
            label: Arc::from(sanitize_label(label.as_ref())),
        }
    }

    /// A new owner with a fresh random token and a label already sanitised (shared, not
    /// copied: a client makes one owner per acquisition).
    pub(crate) fn with_shared_label(label: &Arc<str>) -> Self {
        Owner {
            token: OwnerToken::generate(),
            label: label.clone(),
        }
    }

    /// The label, shared.
    pub(crate) fn shared_label(&self) -> &Arc<str> {
        &self.label
    }

    /// A new owner labelled `hostname/pid`.
    pub fn with_default_label() -> Self {
        Owner::new(default_label())
    }

    /// The secret token.
    pub fn token(&self) -> &OwnerToken {
        &self.token
    }

    /// The public label.
    pub fn label(&self) -> &str {
        &self.label
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("label", &&*self.label)
            .finish_non_exhaustive()
    }
}

/// `hostname/pid`, the label owners get when the caller names none.
pub fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}/{}", std::process::id())
}

fn sanitize_label(label: &str) -> String {
    let mut out = String::with_capacity(label.len().min(MAX_LABEL_LEN));
    for c in label.chars() {
        let c = if c.is_control() { '?' } else { c };
        if out.len() + c.len_utf8() > MAX_LABEL_LEN {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_tokens_are_distinct_across_threads_and_refills() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..pool::TOKENS * 40 + 3)
                        .map(|_| OwnerToken::generate())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for t in threads {
            for token in t.join().unwrap() {
                assert_ne!(token.as_bytes(), &[0u8; 16]);
                assert!(seen.insert(token), "a token came out twice");
            }
        }
        assert_eq!(seen.len(), 4 * (pool::TOKENS * 40 + 3));
    }

    #[test]
    fn tokens_are_distinct_and_redacted() {
        let a = Owner::new("a");
        let b = Owner::new("a");
        assert_ne!(a.token(), b.token());
        assert_eq!(a.token().to_hex().len(), 32);
        let dbg = format!("{a:?} {:?}", a.token());
        assert!(!dbg.contains(&a.token().to_hex()), "{dbg}");
    }

    #[test]
    fn hex_is_two_lowercase_digits_per_byte_in_order() {
        let mut bytes = [0u8; 16];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(17).wrapping_add(0x0a);
        }
        bytes[15] = 0xff;
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(OwnerToken::from_bytes(bytes).to_hex(), expected);
        assert_eq!(OwnerToken::from_bytes([0; 16]).to_hex(), "0".repeat(32));
    }

    #[test]
    fn labels_are_sanitised() {
        assert_eq!(Owner::new("a\nb").label(), "a?b");
        assert_eq!(Owner::new("é".repeat(200)).label().len(), 254);
    }
}
