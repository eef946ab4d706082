//! A Lua script that keeps its source, so that connecting loads every script in one
//! pipelined round trip, and that has a twin publishing on sharded channels for a Redis
//! Cluster.

use std::borrow::Cow;
use std::sync::OnceLock;

use redis::{Cmd, Script};

/// A script with its source kept, so that connecting loads every script in one pipelined
/// round trip (`redis::Script` keeps only the hash).
#[derive(Debug)]
pub struct Lua {
    source: Cow<'static, str>,
    script: Script,
    /// The [`sharded`](Self::sharded) twin, made at its first use.
    sharded: OnceLock<Option<Box<Lua>>>,
}

/// How the scripts announce a release on a single server, and on a Redis Cluster: a
/// sharded `SPUBLISH` reaches only the subscribers of the shard that owns the channel's
/// slot (the lock's, by its hash tag), where a `PUBLISH` is copied to every node.
const PUBLISH: &str = "redis.call('PUBLISH',";
const SPUBLISH: &str = "redis.call('SPUBLISH',";

impl Lua {
    /// The script of `source`.
    pub fn new(source: &'static str) -> Self {
        Lua {
            source: Cow::Borrowed(source),
            script: Script::new(source),
            sharded: OnceLock::new(),
        }
    }

    /// `SCRIPT LOAD` of this script.
    pub fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source.as_ref());
        cmd
    }

    /// This script for a Redis Cluster: the same, with every `PUBLISH` a sharded
    /// `SPUBLISH` (Redis 7). A script that publishes nothing is its own twin.
    pub fn sharded(&self) -> &Lua {
        let twin = self.sharded.get_or_init(|| {
            self.source.contains(PUBLISH).then(|| {
                let source = self.source.replace(PUBLISH, SPUBLISH);
                Box::new(Lua {
                    script: Script::new(&source),
                    source: Cow::Owned(source),
                    sharded: OnceLock::new(),
                })
            })
        });
        twin.as_deref().unwrap_or(self)
    }

    /// This script, or its [`sharded`](Self::sharded) twin when `sharded`.
    pub fn for_cluster(&self, cluster: bool) -> &Lua {
        if cluster {
            self.sharded()
        } else {
            self
        }
    }
}

impl std::ops::Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sharded_twin_publishes_on_sharded_channels_only() {
        let publishing =
            Lua::new("redis.call('DEL', KEYS[1])\nredis.call('PUBLISH', KEYS[1], '1')");
        let twin = publishing.sharded();
        assert!(twin.source.contains("redis.call('SPUBLISH', KEYS[1], '1')"));
        assert!(!twin.source.contains(PUBLISH));
        assert_ne!(twin.get_hash(), publishing.get_hash());
        assert_eq!(twin.get_hash(), Script::new(&twin.source).get_hash());
        assert!(std::ptr::eq(publishing.for_cluster(false), &publishing));
        assert!(std::ptr::eq(publishing.for_cluster(true), twin));
        let quiet = Lua::new("return redis.call('GET', KEYS[1])");
        assert!(std::ptr::eq(quiet.sharded(), &quiet));
    }

    #[test]
    fn every_publishing_script_has_a_twin() {
        for script in crate::scripts::all() {
            let twin = script.sharded();
            assert!(!twin.source.contains("'PUBLISH'"), "{}", script.source);
            assert_eq!(
                script.source.contains("'PUBLISH'"),
                !std::ptr::eq(twin, script),
                "{}",
                script.source
            );
        }
    }
}
