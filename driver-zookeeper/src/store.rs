//! The znode layout and the one grant rule.
//!
//! A lock key is a container node `<root>/<encoded key>`; each claim on it, held or
//! waiting, is an ephemeral sequential child named as Curator's `InterProcessMutex` names
//! its nodes: `_c_<id>-lock-<sequence>` for an exclusive claim, where `<id>` (a UUID's
//! shape) is derived from the owner, so a claim whose answer was lost is found again. A
//! shared claim puts its weight between the id and `lock-`: `_c_<id>-read-lock-<seq>` (a
//! reader), `_c_<id>-p<k>of<n>-lock-<seq>` (k permits of a semaphore of n). Curator sorts
//! children by the text after `lock-`, so a Curator mutex on the same path and a
//! distlock exclusive lock queue in one line and exclude each other; a child that is not
//! ours (Curator's) counts as an exclusive claim.
//!
//! The rule, written once: children sorted by sequence; a claim is granted when the
//! weights of every claim *before* it (held or waiting) plus its own fit the capacity.
//! Waiting claims count, so the queue is FIFO: a writer is not starved by later readers.

use lockcore::driver::READ_WRITE_CAPACITY;
use lockcore::{Claim, LockKey};

/// The prefix of every node name Curator's recipes and this driver create.
const PROTECTED: &str = "_c_";

/// What separates a node's name from its sequence number (Curator's lock name).
const LOCK_NAME: &str = "lock-";

/// The node of `key` under `root`: the key percent-encoded into one path segment.
///
/// Every byte outside `[A-Za-z0-9_-:]` is escaped (`%2F` for `/`, `%25` for `%`, UTF-8
/// bytes one by one), so the segment is plain ASCII ZooKeeper accepts, no key names a node
/// below another, and two keys never share a node. `.` is kept except in the keys `.` and
/// `..`, which ZooKeeper refuses as names.
pub(crate) fn key_path(root: &str, key: &LockKey) -> String {
    let text = key.as_str();
    let mut path = String::with_capacity(root.len() + 1 + text.len());
    path.push_str(root);
    path.push('/');
    let dots = text == "." || text == "..";
    for b in text.bytes() {
        let plain =
            b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':') || (b == b'.' && !dots);
        if plain {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

/// The start of the name of `id`'s node for `claim`, before the server's sequence number.
pub(crate) fn node_prefix(id: &str, claim: &Claim) -> String {
    let weight = match claim.mode() {
        lockcore::ClaimMode::Exclusive => String::new(),
        lockcore::ClaimMode::Shared => "read-".to_owned(),
        _ => format!("p{}of{}-", claim.weight(), claim.capacity()),
    };
    format!("{PROTECTED}{id}-{weight}{LOCK_NAME}")
}

/// One child of a key's node, as the rule reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    /// The child's name.
    pub name: String,
    /// The server's sequence number: the order of the queue.
    pub seq: i64,
    /// The owner id in the name, for nodes of this driver's (and Curator's) shape.
    pub id: Option<String>,
    /// The claim the name states; `None` for a node of another program (a Curator mutex),
    /// which takes the whole key.
    pub claim: Option<Claim>,
}

impl Node {
    /// Reads a child's name.
    pub fn parse(name: &str) -> Node {
        let seq = name
            .rfind(LOCK_NAME)
            .and_then(|at| name[at + LOCK_NAME.len()..].parse::<i64>().ok())
            .unwrap_or(i64::MAX);
        let mut node = Node {
            name: name.to_owned(),
            seq,
            id: None,
            claim: None,
        };
        // `_c_` + 36 characters of a UUID + `-`, then the weight and `lock-`.
        let Some(rest) = name.strip_prefix(PROTECTED) else {
            return node;
        };
        if rest.len() < 37 || !rest.is_char_boundary(36) || rest.as_bytes()[36] != b'-' {
            return node;
        }
        node.id = Some(rest[..36].to_owned());
        let Some(end) = rest[37..].rfind(LOCK_NAME) else {
            return node;
        };
        node.claim = match &rest[37..37 + end] {
            "" => Some(Claim::exclusive()),
            "read-" => Some(Claim::shared()),
            weight => weight
                .strip_prefix('p')
                .and_then(|w| w.strip_suffix('-'))
                .and_then(|w| w.split_once("of"))
                .and_then(|(k, n)| Claim::from_parts(k.parse().ok()?, n.parse().ok()?)),
        };
        node
    }

    /// What this node takes of a key of `capacity`: all of it when its claim is another
    /// program's or of another capacity.
    fn weight_in(&self, capacity: u64) -> u64 {
        match self.claim {
            Some(c) if c.capacity() == capacity => c.weight(),
            _ => capacity,
        }
    }

    fn capacity(&self) -> u64 {
        self.claim.map_or(READ_WRITE_CAPACITY, |c| c.capacity())
    }
}

/// A key's children in queue order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Queue {
    /// Sorted by sequence number.
    pub nodes: Vec<Node>,
}

impl Queue {
    /// The queue of a key's children (`get_children`'s answer).
    pub fn new(children: &[String]) -> Queue {
        let mut nodes: Vec<Node> = children.iter().map(|c| Node::parse(c)).collect();
        nodes.sort_by_key(|n| n.seq);
        Queue { nodes }
    }

    /// Where the node whose sequence is `seq` is.
    pub fn position_of_seq(&self, seq: i64) -> Option<usize> {
        self.nodes.iter().position(|n| n.seq == seq)
    }

    /// The rule: the node at `i` is granted when every node before it, plus itself, fits
    /// its capacity.
    pub fn granted(&self, i: usize) -> bool {
        let Some(node) = self.nodes.get(i) else {
            return false;
        };
        let capacity = node.capacity();
        let before = self.nodes[..i]
            .iter()
            .fold(0u64, |sum, n| sum.saturating_add(n.weight_in(capacity)));
        before.saturating_add(node.weight_in(capacity)) <= capacity
    }

    /// The granted nodes, in grant order.
    pub fn holders(&self) -> impl Iterator<Item = &Node> {
        (0..self.nodes.len())
            .filter(|&i| self.granted(i))
            .map(|i| &self.nodes[i])
    }

    /// The capacity of another owner's claim that differs from `claim`'s, if any: such a
    /// claim may not join the key.
    pub fn mismatch(&self, claim: &Claim, id: &str) -> Option<u64> {
        self.nodes
            .iter()
            .filter(|n| n.id.as_deref() != Some(id))
            .filter_map(|n| n.claim)
            .map(|c| c.capacity())
            .find(|&c| c != claim.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0a0a0a0a-0000-4000-8000-000000000001";
    const B: &str = "0b0b0b0b-0000-4000-8000-000000000002";

    fn name(id: &str, claim: &Claim, seq: i64) -> String {
        format!("{}{seq:010}", node_prefix(id, claim))
    }

    #[test]
    fn keys_are_one_escaped_segment() {
        let path = |k: &str| key_path("/r", &LockKey::new(k).unwrap());
        assert_eq!(path("invoice-42"), "/r/invoice-42");
        assert_eq!(path("a/b"), "/r/a%2Fb");
        assert_eq!(path("a%2Fb"), "/r/a%252Fb");
        assert_eq!(path(".."), "/r/%2E%2E");
        assert_eq!(path("a.b"), "/r/a.b");
        assert_eq!(path("é"), "/r/%C3%A9");
        assert_ne!(path("A"), path("a"));
    }

    #[test]
    fn names_read_back() {
        for claim in [
            Claim::exclusive(),
            Claim::shared(),
            Claim::permits(2, 5).unwrap(),
        ] {
            let node = Node::parse(&name(A, &claim, 7));
            assert_eq!(
                (node.seq, node.id.as_deref(), node.claim),
                (7, Some(A), Some(claim))
            );
        }
        let curator = Node::parse("_c_1f0e2d3c-4b5a-6978-8695-a4b3c2d1e0f9-lock-0000000003");
        assert_eq!(curator.claim, Some(Claim::exclusive()));
        let foreign = Node::parse("member-0000000004");
        assert_eq!((foreign.seq, foreign.claim), (i64::MAX, None));
    }

    #[test]
    fn the_rule_is_fifo_by_weight() {
        let r = Claim::shared();
        let w = Claim::exclusive();
        let q = Queue::new(&[
            name(A, &r, 1),
            name(B, &r, 2),
            name(A, &w, 3),
            name(B, &r, 4),
        ]);
        assert_eq!(
            (0..4).map(|i| q.granted(i)).collect::<Vec<_>>(),
            [true, true, false, false]
        );
        let p = Claim::permits(2, 3).unwrap();
        let one = Claim::permits(1, 3).unwrap();
        let q = Queue::new(&[name(A, &one, 1), name(B, &p, 2), name(B, &one, 3)]);
        assert_eq!(
            (0..3).map(|i| q.granted(i)).collect::<Vec<_>>(),
            [true, true, false]
        );
        assert_eq!(q.mismatch(&Claim::exclusive(), A), Some(3));
        let q = Queue::new(&["other-lock-0000000001".to_owned(), name(A, &r, 2)]);
        assert!(q.granted(0) && !q.granted(1));
    }
}
