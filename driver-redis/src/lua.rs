//! A Lua script that keeps its source, so that connecting loads every script in one
//! pipelined round trip.

use redis::{Cmd, Script};

/// A script with its source kept, so that connecting loads every script in one pipelined
/// round trip (`redis::Script` keeps only the hash).
#[derive(Debug)]
pub struct Lua {
    source: &'static str,
    script: Script,
}

impl Lua {
    /// The script of `source`.
    pub fn new(source: &'static str) -> Self {
        Lua {
            source,
            script: Script::new(source),
        }
    }

    /// `SCRIPT LOAD` of this script.
    pub fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

impl std::ops::Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}
