//! What a wait for a release started from: when a key's state ends it at once.

use lockcore::driver::WaitHint;

/// What a wait started from, as the refused claim's hint says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Since {
    /// The fence the refused claim saw: another one means something changed.
    pub(crate) revision: Option<i64>,
    /// Refused only by another owner's reservation: the key may be free of leases but
    /// reserved, which is no reason to return at once (its owner takes it next; a removed
    /// reservation is announced, a lapsed one ends the client's bounded wait).
    pub(crate) reserved: bool,
}

impl Since {
    pub(crate) fn of(hint: &WaitHint) -> Self {
        Since {
            revision: hint.revision(),
            reserved: hint.is_behind_reservation(),
        }
    }

    /// Whether a key in this state (`None`: free of leases) ends the wait at once.
    pub(crate) fn changed(&self, fence: Option<i64>) -> bool {
        match fence {
            None => !self.reserved,
            Some(fence) => self.revision.is_some_and(|r| r != fence),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_key_ends_a_wait_unless_only_a_reservation_refused() {
        let plain = Since::of(&WaitHint::at_revision(7));
        let reserved = Since::of(&WaitHint::at_revision(7).behind_reservation());
        assert!(plain.changed(None));
        assert!(!reserved.changed(None));
        for since in [plain, reserved] {
            assert!(!since.changed(Some(7)), "{since:?}");
            assert!(since.changed(Some(8)), "{since:?}");
        }
        // Without a revision only a free key is news.
        assert!(!Since::of(&WaitHint::none()).changed(Some(8)));
    }
}
