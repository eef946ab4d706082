//! Tokens a broken store hands out from a counter of its own instead of the memory store's.

use std::collections::HashMap;

use lockcore::{FencingToken, LockKey, Owner};

/// A per-key counter of the broken store (it starts at 1 again in a fresh store: no
/// floor), and the token shown for each grant of the inner store.
#[derive(Debug, Default)]
pub(super) struct Tokens {
    shown: HashMap<(LockKey, FencingToken), FencingToken>,
    last: HashMap<LockKey, u64>,
    /// The token each (key, owner) took at its first attempt.
    taken: HashMap<(LockKey, String), FencingToken>,
}

impl Tokens {
    /// The key's next token.
    pub(super) fn next(&mut self, key: &LockKey) -> FencingToken {
        let last = self.last.entry(key.clone()).or_default();
        *last += 1;
        FencingToken(*last)
    }

    /// The token `owner` took at its first attempt on `key` (taken now if this is it).
    pub(super) fn taken(&mut self, key: &LockKey, owner: &Owner) -> FencingToken {
        let id = (key.clone(), owner.token().to_hex());
        if let Some(token) = self.taken.get(&id) {
            return *token;
        }
        let token = self.next(key);
        self.taken.insert(id, token);
        token
    }

    /// The token shown for the inner grant `inner` of `key`: the one shown before (a
    /// same-owner re-grant), else `token`.
    pub(super) fn show(
        &mut self,
        key: &LockKey,
        inner: FencingToken,
        token: FencingToken,
    ) -> FencingToken {
        *self.shown.entry((key.clone(), inner)).or_insert(token)
    }

    /// The token shown for the inner grant `inner` of `key`, if one was set.
    pub(super) fn shown(&self, key: &LockKey, inner: FencingToken) -> Option<FencingToken> {
        self.shown.get(&(key.clone(), inner)).copied()
    }
}
