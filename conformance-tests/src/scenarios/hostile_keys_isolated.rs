use std::sync::Arc;

use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Failure, Harness, Outcome};

/// Keys full of quoting, wildcard, separator, hash-tag and escape characters, case and
/// trailing-space variants, prefixes of one another, unicode and the maximum length are
/// each their own lock: holding one never holds, frees or reveals another.
pub async fn hostile_keys_isolated(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl() * 20;
    let c = clients(&*h, 2).await?;
    let base = keys.key("");
    let mut names: Vec<String> = [
        "a",
        "A",
        "a ",
        " a",
        "a\u{a0}",
        "ab",
        "a:b",
        "a/b",
        "a\\b",
        "a'b",
        "a\"b",
        "a`b",
        "a;b",
        "a%",
        "a_",
        "a*",
        "a?",
        "a[b]",
        "{a}",
        "{a",
        "a}",
        "}{",
        "a--b",
        "a/*b*/",
        "' OR '1'='1",
        "$1",
        "ключ",
        "鍵",
        "🔒",
        "e\u{301}",
        "é",
    ]
    .iter()
    .map(|s| format!("{base}{s}"))
    .collect();
    names.push(format!("{base}{}", "x".repeat(255 - base.len())));
    names.push(format!("{base}{}", "x".repeat(254 - base.len())));
    names.push(base.trim_end_matches(':').to_owned());
    let mut guards = Vec::new();
    for name in &names {
        let g = c[0].lock(name).ttl(ttl).try_acquire().await?;
        let Some(g) = g else {
            return Err(Failure(format!(
                "key {name:?} was held before anyone took it"
            )));
        };
        guards.push(g);
    }
    for (i, name) in names.iter().enumerate() {
        let info = c[1].inspect(name).await?;
        check!(
            info.map(|i| i.token) == Some(guards[i].token()),
            "inspect of {name:?} shows another key's holder"
        );
        check!(
            c[1].lock(name).ttl(ttl).try_acquire().await?.is_none(),
            "held key {name:?} was granted"
        );
    }
    // Free them one at a time: each release frees exactly its own key.
    let mut guards: Vec<_> = guards.into_iter().map(Some).collect();
    for i in 0..names.len() {
        if let Some(g) = guards[i].take() {
            g.release().await?;
        }
        check!(
            is_free(&c[1], &names[i], ttl).await?,
            "{:?} stayed held after its release",
            names[i]
        );
        for (j, name) in names.iter().enumerate().skip(i + 1) {
            if j == i + 1 || j == names.len() - 1 {
                check!(
                    c[1].inspect(name).await?.is_some(),
                    "releasing {:?} freed {name:?}",
                    names[i]
                );
            }
        }
    }
    Ok(())
}
