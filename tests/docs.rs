//! Keeps the documentation's code honest: every Markdown page (README.md, docs/*.md) is
//! compiled as doc tests through `src/lib.rs`, and every code block in it either compiles
//! as Rust, says why it does not (`ignore` with a reason), or names its real language.
//!
//! The doc tests themselves run with `cargo test --doc -p distlock --all-features`
//! (`scripts/test.sh` runs them for the whole workspace); this test makes sure a new page or
//! a new block cannot slip past them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Languages of blocks that are not Rust and are not compiled (shell sessions, config
/// files, SQL, URL grammars, …). A tag outside this list and outside rustdoc's own is
/// refused: rustdoc would silently skip a block tagged `rs` or `Rust`.
const NOT_RUST: &[&str] = &[
    "sh", "bash", "console", "shell", "text", "toml", "sql", "json", "yaml", "ini", "diff",
];

/// Tokens of a code block's info string that rustdoc reads as doc test attributes.
fn is_rustdoc_attribute(token: &str) -> bool {
    matches!(
        token,
        "rust"
            | "ignore"
            | "no_run"
            | "should_panic"
            | "compile_fail"
            | "test_harness"
            | "standalone_crate"
    ) || token.starts_with("edition")
        || token.starts_with("ignore-")
}

/// Crates a `distlock` user does not depend on, by their published names: the facade
/// re-exports them as `distlock::lockcore`, `distlock::redis`, `distlock::redlock`,
/// `distlock::sql` and `distlock::etcd`. Only this check keeps them out of the users' pages.
const NOT_A_USER_DEPENDENCY: &[&str] = &[
    "distlock_core",
    "distlock_redis",
    "distlock_redlock",
    "distlock_sql",
    "distlock_etcd",
];

/// The names the workspace's own code gives its crates (`lockcore = { package =
/// "distlock-core", .. }`). No reader can type them: a page says the published name, and a
/// compiled block maps it on a hidden line (`# extern crate lockcore as distlock_core;`).
/// Doc tests would still compile with these names (a package's doc tests see all of its
/// dependencies), so only this check keeps them off the pages.
const WORKSPACE_NAMES: &[&str] = &[
    "lockcore",
    "conformance_tests",
    "driver_redis",
    "driver_redlock",
    "driver_sql",
    "driver_etcd",
    "driver_zookeeper",
];

/// Pages written for driver authors, who depend on `distlock-core` directly.
const DRIVER_AUTHOR_PAGES: &[&str] = &["docs/writing-a-driver.md"];

/// The crates of `names` that `line` names as the start of a path (`lockcore::X`, `use
/// distlock_sql::…`), not as a module of another (`distlock::lockcore`).
fn foreign_crates(line: &str, names: &[&'static str]) -> Vec<&'static str> {
    let mut found = Vec::new();
    for krate in names {
        let pattern = format!("{krate}::");
        let mut from = 0;
        while let Some(at) = line[from..].find(&pattern) {
            let start = from + at;
            let before = line[..start].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                found.push(*krate);
                break;
            }
            from = start + pattern.len();
        }
    }
    found
}

/// One problem found in a page, with the 1-based line of the block's opening fence.
#[derive(Debug, PartialEq, Eq)]
struct Problem {
    line: usize,
    what: String,
}

/// Checks every fenced code block of one Markdown page; `for_users`: the page is read by
/// users of the `distlock` crate (see [`foreign_crates`]).
fn check_blocks(markdown: &str, for_users: bool) -> Vec<Problem> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut problems = Vec::new();
    let mut open: Option<String> = None; // the fence that opened the current block
    let mut in_rust = false; // whether the current block is a Rust one
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let fence: String = trimmed
            .chars()
            .take_while(|&c| c == '`' || c == '~')
            .collect();
        let is_fence = indent <= 3
            && fence.len() >= 3
            && fence
                .chars()
                .all(|c| c == fence.chars().next().unwrap_or('`'));
        if let Some(opening) = &open {
            // Inside a block only a fence of the same kind, at least as long, closes it.
            if is_fence
                && fence.starts_with(opening.as_str())
                && trimmed[fence.len()..].trim().is_empty()
            {
                open = None;
            } else if in_rust {
                // A hidden line (`# …`) is the workspace's business, not the reader's.
                if !trimmed.starts_with("# ") {
                    for krate in foreign_crates(line, WORKSPACE_NAMES) {
                        problems.push(Problem {
                            line: i + 1,
                            what: format!(
                                "`{krate}::` is the workspace's name for a crate: write its \
                                 published name (distlock_core, distlock_conformance, \
                                 distlock_redis, …), mapped on a hidden line"
                            ),
                        });
                    }
                }
                if for_users {
                    for krate in foreign_crates(line, NOT_A_USER_DEPENDENCY) {
                        problems.push(Problem {
                            line: i + 1,
                            what: format!(
                                "`{krate}::` is not a dependency of a distlock user: reach it \
                                 through the facade (distlock::…)"
                            ),
                        });
                    }
                }
            }
            continue;
        }
        if !is_fence {
            continue;
        }
        open = Some(fence.clone());
        in_rust = false;
        let info = trimmed[fence.len()..].trim();
        let tokens: Vec<&str> = info
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .collect();
        let line_no = i + 1;
        if tokens.is_empty() {
            problems.push(Problem {
                line: line_no,
                what: "a code block without a language: rustdoc compiles it as Rust; tag it \
                       `rust` (a doc test) or with its real language (`sh`, `text`, `toml`, …)"
                    .into(),
            });
            continue;
        }
        let rust = tokens.contains(&"rust") || tokens.iter().all(|t| is_rustdoc_attribute(t));
        in_rust = rust;
        if !rust {
            if !NOT_RUST.contains(&tokens[0]) {
                problems.push(Problem {
                    line: line_no,
                    what: format!(
                        "unknown code block language {:?}: rustdoc does not compile it; write \
                         `rust` for Rust, or add the language to NOT_RUST in tests/docs.rs",
                        tokens[0]
                    ),
                });
            }
            continue;
        }
        let ignored = tokens
            .iter()
            .any(|t| *t == "ignore" || t.starts_with("ignore-"));
        if ignored && !has_ignore_reason(&lines[..i]) {
            problems.push(Problem {
                line: line_no,
                what: "an `ignore`d Rust block without its reason: put `<!-- ignore: why it \
                       cannot compile -->` on the lines right above it"
                    .into(),
            });
        }
    }
    if open.is_some() {
        problems.push(Problem {
            line: lines.len(),
            what: "a code block that is never closed".into(),
        });
    }
    problems
}

/// Whether the lines right above a block end with an `<!-- ignore: … -->` comment.
fn has_ignore_reason(before: &[&str]) -> bool {
    let Some(last) = before.last() else {
        return false;
    };
    if !last.trim_end().ends_with("-->") {
        return false;
    }
    // Walk up to the comment's start (it may span lines).
    for line in before.iter().rev() {
        if let Some(start) = line.find("<!--") {
            let reason = line[start + 4..].trim_start();
            return reason
                .strip_prefix("ignore:")
                .is_some_and(|r| !r.trim().trim_end_matches("-->").trim().is_empty());
        }
    }
    false
}

/// The pages `src/lib.rs` includes as doc tests: `#[doc = include_str!("../PATH")]` right
/// after `#[cfg(doctest)]` (or `#[cfg(all(doctest, feature = "…"))]` for a page about a
/// feature), as paths relative to the package root.
fn wired_pages(lib_rs: &str) -> BTreeSet<String> {
    let lines: Vec<&str> = lib_rs.lines().map(str::trim).collect();
    let mut wired = BTreeSet::new();
    for pair in lines.windows(2) {
        // A page whose examples need a feature is compiled with it (CI runs the doc tests
        // with every feature).
        let doctest = pair[0] == "#[cfg(doctest)]"
            || (pair[0].starts_with("#[cfg(all(doctest, feature = \"")
                && pair[0].ends_with("\"))]"));
        if !doctest {
            continue;
        }
        let Some(rest) = pair[1].strip_prefix("#[doc = include_str!(\"../") else {
            continue;
        };
        if let Some(path) = rest.strip_suffix("\")]") {
            wired.insert(path.to_owned());
        }
    }
    wired
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, relative to the package root.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_owned()];
    let docs = root().join("docs");
    let entries =
        std::fs::read_dir(&docs).unwrap_or_else(|e| panic!("cannot list {}: {e}", docs.display()));
    for entry in entries {
        let path = entry.expect("a readable docs/ entry").path();
        if path.extension().is_some_and(|ext| ext == "md") {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a UTF-8 file name in docs/");
            pages.push(format!("docs/{name}"));
        }
    }
    pages.sort();
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_page_is_compiled_as_doc_tests() {
    let wired = wired_pages(&read(&root().join("src/lib.rs")));
    let missing: Vec<String> = pages().into_iter().filter(|p| !wired.contains(p)).collect();
    assert!(
        missing.is_empty(),
        "these pages are not compiled as doc tests: {missing:?}. Add to the bottom of \
         src/lib.rs, for each:\n\n#[cfg(doctest)]\n#[doc = include_str!(\"../docs/NAME.md\")]\n\
         pub struct NameDoctests;\n"
    );
}

#[test]
fn every_code_block_compiles_or_says_why_not() {
    let mut report = String::new();
    for page in pages() {
        let for_users = !DRIVER_AUTHOR_PAGES.contains(&page.as_str());
        for problem in check_blocks(&read(&root().join(&page)), for_users) {
            report.push_str(&format!("{page}:{}: {}\n", problem.line, problem.what));
        }
    }
    assert!(report.is_empty(), "\n{report}");
}

// The checks themselves, on small pages: each must catch what it is there for.

#[test]
fn checker_accepts_rust_tagged_and_other_languages() {
    let page = "\
```rust
fn main() {}
```

```rust,no_run
fn main() {}
```

```sh
cargo test
```

<!-- ignore: needs the driver's own crate -->
```rust,ignore
my_driver::connect();
```

````text
```rust
not a block of its own
```
````
";
    assert_eq!(check_blocks(page, true), Vec::new());
}

#[test]
fn checker_refuses_untagged_unknown_and_unexplained_blocks() {
    let page = "\
```
cargo test
```

```rs
fn main() {}
```

```rust,ignore
broken();
```

Some text.
```ignore
broken();
```
";
    let lines: Vec<usize> = check_blocks(page, true).iter().map(|p| p.line).collect();
    assert_eq!(lines, vec![1, 5, 9, 14]);
}

#[test]
fn checker_reads_multi_line_ignore_reasons() {
    let page = "\
<!-- ignore: a file of the driver's own crate,
which distlock cannot depend on -->
```rust,ignore
x
```

<!-- ignore: -->
```rust,ignore
x
```

<!-- not a reason -->
```rust,ignore
x
```
";
    let lines: Vec<usize> = check_blocks(page, true).iter().map(|p| p.line).collect();
    assert_eq!(lines, vec![8, 13]);
}

#[test]
fn checker_refuses_driver_crates_in_users_pages() {
    let page = "\
```rust
use distlock::sql::SqlOptions;
let c = distlock::lockcore::LockClient::new(b);
use distlock_sql::SqlOptions;
let c = distlock_core::LockClient::new(b);
```

```text
distlock_sql::connect is fine in prose-like blocks
```
";
    let lines: Vec<usize> = check_blocks(page, true).iter().map(|p| p.line).collect();
    assert_eq!(lines, vec![4, 5]);
    assert_eq!(
        check_blocks(page, false),
        Vec::new(),
        "driver authors use distlock-core"
    );
}

#[test]
fn checker_refuses_workspace_names_outside_hidden_lines() {
    let page = "\
```rust
# extern crate lockcore as distlock_core;
use distlock_core::LockClient;
use lockcore::LockKey;
conformance_tests::suite!(x);
```
";
    for for_users in [true, false] {
        let problems = check_blocks(page, for_users);
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        let expected = if for_users { vec![3, 4, 5] } else { vec![4, 5] };
        assert_eq!(lines, expected, "{problems:?}");
    }
}

#[test]
fn wiring_is_read_from_cfg_doctest_items_only() {
    let lib = "\
/// The README.
#[cfg(doctest)]
#[doc = include_str!(\"../README.md\")]
pub struct ReadmeDoctests;

#[doc = include_str!(\"../docs/not-a-doctest.md\")]
pub struct Documented;

#[cfg(doctest)]
#[doc = include_str!(\"../docs/sql.md\")]
pub struct SqlDoctests;
";
    let wired: Vec<String> = wired_pages(lib).into_iter().collect();
    assert_eq!(
        wired,
        vec!["README.md".to_owned(), "docs/sql.md".to_owned()]
    );
}
