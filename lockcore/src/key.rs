//! Lock keys, validated once for every backend.

use std::fmt;
use std::sync::Arc;

use crate::LockError;

/// The longest key, in bytes of UTF-8.
pub const MAX_KEY_LEN: usize = 255;

/// A validated lock name: 1..=255 bytes of UTF-8 without NUL or other control characters.
///
/// Keys are case-sensitive and exact: no trimming, no normalisation, no collation. `"A"`,
/// `"a"` and `"a "` are three different locks on every backend. Backends treat keys as data
/// (bound parameters, script arguments, escaped ranges), never as code.
///
/// # Examples
///
/// ```
/// use distlock_core::LockKey;
///
/// let key = LockKey::new("invoice:42")?;
/// assert_eq!(key.as_str(), "invoice:42");
/// assert!(LockKey::new("").is_err());
/// assert!(LockKey::new("tab\there").is_err());
/// # Ok::<(), distlock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// Validates `key`.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] if the key is empty, longer than [`MAX_KEY_LEN`] bytes, or
    /// contains a control character (NUL, newline, tab, DEL, C1 controls).
    pub fn new(key: impl AsRef<str>) -> Result<Self, LockError> {
        let key = key.as_ref();
        if key.is_empty() {
            return Err(LockError::InvalidKey {
                reason: "the key is empty".into(),
            });
        }
        if key.len() > MAX_KEY_LEN {
            return Err(LockError::InvalidKey {
                reason: format!(
                    "the key is {} bytes long, the limit is {MAX_KEY_LEN}",
                    key.len()
                ),
            });
        }
        if let Some((at, c)) = key.char_indices().find(|(_, c)| c.is_control()) {
            return Err(LockError::InvalidKey {
                reason: format!("control character U+{:04X} at byte {at}", c as u32),
            });
        }
        Ok(LockKey(Arc::from(key)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as bytes (what byte-exact stores compare).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockKey").field(&&*self.0).finish()
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockKey {
    type Error = LockError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        LockKey::new(value)
    }
}

impl TryFrom<String> for LockKey {
    type Error = LockError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        LockKey::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_exact_keys() {
        for k in [
            "a",
            "A",
            "a ",
            " a",
            "ключ",
            "{x}",
            "a/b:c*%_'\"\\",
            &"x".repeat(255),
        ] {
            assert_eq!(LockKey::new(k).unwrap().as_str(), k);
        }
        assert_ne!(LockKey::new("a").unwrap(), LockKey::new("A").unwrap());
    }

    #[test]
    fn rejects_bad_keys() {
        for k in [
            "",
            "a\0b",
            "line\n",
            "\u{7f}",
            "\u{85}",
            &"x".repeat(256),
            &"é".repeat(128),
        ] {
            assert!(
                matches!(LockKey::new(k), Err(LockError::InvalidKey { .. })),
                "{k:?}"
            );
        }
    }
}
