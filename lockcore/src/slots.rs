//! Reentrancy: one slot per (key, owner) in a client, where re-entry is counted and
//! acquisition, re-entry and release of that hold take turns.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::hold::Hold;
use crate::{LockKey, Owner, OwnerToken};

/// The reentrancy state of one (key, owner) in one client, behind the async mutex that
/// serialises acquisition, re-entry and release of that hold.
pub(crate) type Slot = tokio::sync::Mutex<SlotState>;

#[derive(Debug, Default)]
pub(crate) struct SlotState {
    pub(crate) hold: Option<Arc<Hold>>,
    pub(crate) count: usize,
}

/// A slot's key: (lock key, owner token).
#[derive(PartialEq, Eq, Hash)]
struct SlotId(LockKey, OwnerToken);

/// A slot in the map, with the number of requests using it (kept here, under the map's
/// mutex, rather than in an allocation of its own beside the slot's).
struct Entered {
    slot: Arc<Slot>,
    pending: usize,
}

type Slots = HashMap<SlotId, Entered>;

/// A client's slots, behind one mutex: a fresh owner's acquire+release locks it twice, for
/// one map operation each, so a map sharded by owner would add code for no gain (lockbench
/// `memory`, `uncontended` and `concurrent64`, is the case that would show one).
#[derive(Default)]
pub(crate) struct SlotMap {
    slots: Mutex<Slots>,
}

impl SlotMap {
    /// The map, locked.
    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of (key, owner), registered as used by one more request.
    pub(crate) fn slot(&self, key: &LockKey, owner: &Owner) -> Arc<Slot> {
        let mut slots = self.slots();
        let entered = slots
            .entry(SlotId(key.clone(), *owner.token()))
            .or_insert_with(|| Entered {
                slot: Arc::default(),
                pending: 0,
            });
        entered.pending += 1;
        entered.slot.clone()
    }

    /// The slot of a fresh owner's hold, made with it and registered: no request of the
    /// owner can have used a slot before (the owner was made for the request that got the
    /// hold, and only the hold's guard shows it).
    pub(crate) fn held(&self, key: &LockKey, owner: &Owner, hold: Arc<Hold>) -> Arc<Slot> {
        let slot = Arc::new(tokio::sync::Mutex::new(SlotState {
            hold: Some(hold),
            count: 1,
        }));
        let entered = Entered {
            slot: slot.clone(),
            pending: 0,
        };
        self.slots()
            .insert(SlotId(key.clone(), *owner.token()), entered);
        slot
    }

    /// A request is done with `slot`.
    pub(crate) fn done_with(&self, key: &LockKey, owner: &Owner, slot: &Arc<Slot>) {
        let mut slots = self.slots();
        let id = SlotId(key.clone(), *owner.token());
        if let Some(entered) = slots.get_mut(&id) {
            if Arc::ptr_eq(&entered.slot, slot) {
                entered.pending = entered.pending.saturating_sub(1);
            }
        }
        // An acquisition that got the lock keeps the slot; its release forgets it.
        let unheld = slot
            .try_lock()
            .map(|state| state.hold.is_none())
            .unwrap_or(false);
        forget_locked(&mut slots, id, slot, unheld);
    }

    /// The hold of `slot` was released: forget the slot unless a request is queued on it.
    pub(crate) fn released(&self, key: &LockKey, owner: &Owner, slot: &Arc<Slot>) {
        let mut slots = self.slots();
        forget_locked(&mut slots, SlotId(key.clone(), *owner.token()), slot, true);
    }

    /// How many slots exist.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots().len()
    }
}

fn forget_locked(slots: &mut Slots, id: SlotId, slot: &Arc<Slot>, unheld: bool) {
    // `pending` only changes under the map's mutex, so no request can pick the slot up
    // between this check and the removal.
    if unheld {
        if let Entry::Occupied(current) = slots.entry(id) {
            if Arc::ptr_eq(&current.get().slot, slot) && current.get().pending == 0 {
                current.remove();
            }
        }
    }
}
