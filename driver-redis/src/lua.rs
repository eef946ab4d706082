//! A Lua script that keeps its source, so that connecting loads every script in one
//! pipelined round trip, and that has a variant for a Redis Cluster when it publishes.

use redis::{Cmd, Script};

/// A script with its source kept, so that connecting loads every script in one pipelined
/// round trip (`redis::Script` keeps only the hash); its hash is computed once.
#[derive(Debug)]
pub struct Lua {
    source: &'static str,
    script: Script,
    /// The variant for a Redis Cluster, when the script publishes.
    cluster: Option<Box<Lua>>,
}

/// The text of a script: the files of `src/lua/` named, in order.
macro_rules! lua_files {
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!("lua/", $file))),+)
    };
}
pub(crate) use lua_files;

/// A [`Lua`] script made of the files of `src/lua/` named, in order, after the prelude
/// that says how it announces a release: `publish.lua` (`PUBLISH`) on a single server,
/// `spublish.lua` (`SPUBLISH`) in its variant for a Redis Cluster, where a sharded
/// `SPUBLISH` reaches only the subscribers of the shard that owns the channel's slot (the
/// lock's, by its hash tag) and a `PUBLISH` is copied to every node.
macro_rules! publishing {
    ($($file:literal),+ $(,)?) => {
        $crate::lua::Lua::publishing(
            $crate::lua::lua_files!("publish.lua", $($file),+),
            $crate::lua::lua_files!("spublish.lua", $($file),+),
        )
    };
}
pub(crate) use publishing;

impl Lua {
    /// A script that publishes nothing: the same text on every topology.
    pub fn new(source: &'static str) -> Self {
        Lua {
            source,
            script: Script::new(source),
            cluster: None,
        }
    }

    /// A script that publishes: `single` for one server, `cluster` for a Redis Cluster.
    pub fn publishing(single: &'static str, cluster: &'static str) -> Self {
        Lua {
            cluster: Some(Box::new(Lua::new(cluster))),
            ..Lua::new(single)
        }
    }

    /// `SCRIPT LOAD` of this script.
    pub fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }

    /// This script, or its variant for a Redis Cluster when `cluster`.
    pub fn for_cluster(&self, cluster: bool) -> &Lua {
        match &self.cluster {
            Some(variant) if cluster => variant,
            _ => self,
        }
    }

    /// The script's text.
    pub fn source(&self) -> &'static str {
        self.source
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

    /// Whether `source` names the command `command` as a Lua string.
    fn names(source: &str, command: &str) -> bool {
        source.contains(&format!("'{command}'")) || source.contains(&format!("\"{command}\""))
    }

    #[test]
    fn every_variant_publishes_as_its_topology_needs() {
        for script in crate::scripts::all() {
            let (single, cluster) = (script.for_cluster(false), script.for_cluster(true));
            assert!(std::ptr::eq(single, script));
            assert!(!names(single.source, "SPUBLISH"), "{}", single.source);
            assert!(!names(cluster.source, "PUBLISH"), "{}", cluster.source);
            // A script that publishes does so through the prelude's `PUBLISH`, which each
            // variant sets; one that does not has one text for both.
            let publishes = script.source.contains("redis.call(PUBLISH,");
            assert_eq!(
                publishes,
                !std::ptr::eq(single, cluster),
                "{}",
                single.source
            );
            if publishes {
                assert!(names(single.source, "PUBLISH"), "{}", single.source);
                assert!(names(cluster.source, "SPUBLISH"), "{}", cluster.source);
                assert_ne!(single.get_hash(), cluster.get_hash());
            }
            assert_eq!(script.get_hash(), Script::new(script.source).get_hash());
        }
    }
}
