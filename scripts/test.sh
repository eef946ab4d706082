#!/usr/bin/env bash
# The test command: everything CI checks, in the order CI checks it, on a clean clone.
#
#   scripts/test.sh
#
# Needs: Debian 12 (or similar) as root, so missing packages can be installed with apt-get;
# a Rust toolchain with rustfmt and clippy; about 15 GB free for target/ (a clean debug build of
# every test with all features), plus the servers' data under /tmp.
#
# Steps: install protoc if missing (the etcd-client crate needs it to build) -> cargo fmt
# check -> scripts/check-layout.py -> every mutant patch applies -> build every test with all
# features -> start the test servers (scripts/servers.sh; stopped again on any exit) -> run
# the test binaries; beside them, at the lowest CPU priority: cargo package of every crate
# and each checked alone with its default features, the doc tests, rustdoc with -D warnings.
# Clippy lints our crates with -D warnings in every build. Prints the time of each step.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STATE_DIR="${DISTLOCK_TEST_SERVERS_DIR:-$ROOT/target/test-servers}"
ENV_FILE="${STATE_DIR%/}.env"
# Bound on each test step when not at a terminal, so a hung test fails the run (and the trap
# still stops the servers) inside CI's 30 minutes.
TEST_TIMEOUT="${DISTLOCK_TEST_TIMEOUT:-25m}"

export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
if [[ -n "${CI:-}" ]]; then
    # A CI build starts from nothing and never rebuilds incrementally: skip the incremental
    # bookkeeping. Locally keep cargo's default so edit-test cycles stay fast.
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
    # Line tables only: a panic's backtrace keeps its files and lines, and the 73 test
    # binaries are linked without full debug information (up to 380 MB each with it).
    export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
fi

now_ms() { date +%s%3N; }
T_START="$(now_ms)"
TIMINGS=()
SERVERS_STARTED=0

summary() {
    local rc=$?
    if [[ -n "${SIDE_PID:-}" ]]; then
        # The script ends early (a step failed): the side steps' cargo and rustc with it.
        pkill -TERM -P "$SIDE_PID" 2>/dev/null || true
        kill "$SIDE_PID" 2>/dev/null || true
    fi
    if ((SERVERS_STARTED)); then
        local t0
        t0="$(now_ms)"
        scripts/servers.sh stop || true
        TIMINGS+=("$(printf '%-14s %8.1f s' "servers stop" "$(ms_to_s $(($(now_ms) - t0)))")")
    fi
    echo
    echo "==> timings"
    local line
    for line in "${TIMINGS[@]+"${TIMINGS[@]}"}"; do
        echo "    $line"
    done
    printf '    %-14s %8.1f s\n' total "$(ms_to_s $(($(now_ms) - T_START)))"
    if ((rc == 0)); then
        echo "==> scripts/test.sh: all steps passed"
    else
        echo "==> free disk now: $(free_disk)"
        echo "==> scripts/test.sh: FAILED (exit $rc)${CURRENT_STEP:+ in step: $CURRENT_STEP}"
    fi
    exit "$rc"
}
trap summary EXIT

# Free space where the build and the servers write. A full disk fails whichever step writes
# next ("No space left on device" from the linker or a server), far from its cause: say how
# much there was, at the start and on failure.
free_disk() {
    df -Ph "$ROOT" "${TMPDIR:-/tmp}" 2>/dev/null |
        awk 'NR > 1 && !seen[$6]++ { printf "%s%s free on %s", (n++ ? ", " : ""), $4, $6 }'
}
echo "==> free disk: $(free_disk)"
FREE_GB="$(df -Pk "$ROOT" | awk 'NR == 2 { printf "%d", $4 / 1048576 }')"
if ((FREE_GB < 15)); then
    echo "==> warning: only ${FREE_GB} GB free for target/; a clean build with all features needs about 15 GB"
fi

ms_to_s() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }

# step NAME COMMAND...: runs COMMAND, records its wall time under NAME.
step() {
    local name="$1"
    shift
    CURRENT_STEP="$name"
    echo
    echo "==> [$name] $*"
    local t0
    t0="$(now_ms)"
    "$@"
    timed "$name" "$t0"
    CURRENT_STEP=""
}

# timed NAME T0: records the wall time since T0 (now_ms) under NAME.
timed() {
    TIMINGS+=("$(printf '%-14s %8.1f s' "$1" "$(ms_to_s $(($(now_ms) - $2)))")")
}

install_protoc() {
    if command -v protoc >/dev/null 2>&1; then
        echo "protoc present: $(protoc --version)"
        return 0
    fi
    if [[ "$(id -u)" != 0 ]]; then
        echo "protoc is missing and installing it needs root: apt-get install protobuf-compiler" >&2
        return 1
    fi
    # Waits for another apt-get or dpkg (a fresh machine's unattended upgrades) to let go of
    # the package manager's lock, as scripts/servers.sh does.
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq protobuf-compiler >/dev/null
    echo "installed: $(protoc --version)"
}

ensure_components() {
    if cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1; then
        return 0
    fi
    rustup component add rustfmt clippy
}

# Without a terminal (CI), a hung test must fail the run, not eat CI's whole budget: timeout
# signals the command's whole process group. At a terminal, run plainly so Ctrl-C reaches
# cargo and the tests (timeout would move them out of the terminal's process group).
bounded() {
    if [[ -t 0 ]]; then
        "$@"
    else
        timeout --kill-after=30s "$TEST_TIMEOUT" "$@"
    fi
}

# Every mutant of the audit (mutants/*.patch) still applies: a patch whose lines moved away
# is reported "stale" by scripts/mutants.sh, i.e. measures nothing.
check_mutants() {
    local stale=0 patch
    for patch in mutants/*.patch; do
        if ! git apply --check "$patch" 2>/dev/null; then
            echo "does not apply any more: $patch (re-aim it at the line it mutates)"
            stale=$((stale + 1))
        fi
    done
    echo "$(find mutants -name '*.patch' | wc -l) mutant patches, $stale stale"
    [[ $stale -eq 0 ]]
}

# PostgreSQL servers that the tests kill on purpose (SIGKILL, a crash) leave their System V
# shared memory segment and their dynamic shared memory files behind. After thousands of
# such kills the kernel's limit on segments (kernel.shmmni, 4096 here) is reached and no
# PostgreSQL starts any more ("setpriv exited early: exit status: 1"). A segment no process
# is attached to, and DSM files while no PostgreSQL runs, belong to nobody: removed before
# the servers start.
clear_stale_ipc() {
    local segments=0 files=0 id
    if command -v ipcs >/dev/null && command -v ipcrm >/dev/null; then
        for id in $(ipcs -m | awk '$3 == "postgres" && $6 == 0 {print $2}'); do
            if ipcrm -m "$id" 2>/dev/null; then
                segments=$((segments + 1))
            fi
        done
    fi
    if ! pgrep -x postgres >/dev/null; then
        files=$(find /dev/shm -maxdepth 1 -name 'PostgreSQL.*' -user postgres 2>/dev/null | wc -l)
        find /dev/shm -maxdepth 1 -name 'PostgreSQL.*' -user postgres -delete 2>/dev/null || true
    fi
    echo "removed $segments stale shared memory segments and $files stale DSM files"
}

# Every crate as crates.io would receive it: `cargo package` packs each one, the workspace's
# unpublished crates standing in for their crates.io versions (cargo >= 1.90). A path
# dependency without a version, a broken manifest or a file list that misses the README fails
# here, not at publish. The files our code includes (`.sql`, `.lua`) are all under `src/`,
# which every package includes whole.
#
# Then what a newcomer builds: each crate alone, as a user who depends on it alone gets it,
# with its default features (the library's `memory`, no database of distlock-sql's); any
# warning of rustc or clippy in our code fails the step. CI otherwise builds only with --all-features, where a
# feature's code can hide a warning, and feature unification across the workspace can hide a
# dependency feature a crate forgot to ask for. `cargo check`, not package's own verify
# build: the same compiler errors and warnings for our code without generating any, which
# took 190 s of each clean CI run.
package_all() {
    cargo package --workspace --locked --allow-dirty --no-verify
    local crate log rc warned=""
    log="$(mktemp)"
    for crate in $(cargo metadata --no-deps --format-version 1 --locked |
        python3 -c 'import json, sys; print(*(p["name"] for p in json.load(sys.stdin)["packages"]))'); do
        set +e
        cargo check --locked -p "$crate" 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        set -e
        ((rc == 0)) || { rm -f "$log"; return "$rc"; }
        warned+="$(grep -E '^warning: `[^`]+` \([^)]*\) generated [0-9]+ warnings?' "$log" || true)"
    done
    rm -f "$log"
    if [[ -n "$warned" ]]; then
        echo "a crate built alone with its default features warned: fix it"
        echo "$warned"
        return 1
    fi
}

start_servers() {
    SERVERS_STARTED=1
    scripts/servers.sh start
    # shellcheck source=/dev/null
    source "$ENV_FILE"
}

step protoc install_protoc
step components ensure_components
step fmt cargo fmt --all -- --check
step layout python3 scripts/check-layout.py
step mutants check_mutants
# Clippy with -D warnings runs inside the builds from here on, not as a `cargo clippy` of
# its own: as the compiler of our crates (RUSTC_WORKSPACE_WRAPPER, what `cargo clippy`
# itself sets; dependencies are compiled by rustc alone), so the test build below is also
# the lint of every target with all features, and the package step's checks lint each crate
# with its default features. A separate `cargo clippy` type-checked everything once more:
# 226 s of each clean CI run.
clippy_driver() {
    local driver
    driver="$(rustc --print sysroot)/bin/clippy-driver"
    [[ -x "$driver" ]] || driver="$(command -v clippy-driver)"
    echo "clippy: $driver ($("$driver" --version))"
    export RUSTC_WORKSPACE_WRAPPER="$driver"
    # How cargo-clippy hands its arguments (`-- -D warnings`) to the driver.
    export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
}
clippy_driver

# The checks that need no server and whose outcome does not depend on time (the packages,
# the doc tests, rustdoc) run beside the test binaries, at the lowest CPU and I/O priority: the
# binaries leave about one of the 2 cores idle (their CPU time is about their wall time),
# and whatever a test needs is theirs first. Run alone, these steps took 336 s of each clean
# CI run. Their output and timings follow the tests'.
side_steps() {
    renice -n 19 -p "$BASHPID" >/dev/null
    # The idle I/O class too: their builds write gigabytes, and a store a test waits on
    # must not queue behind them at the disk.
    ionice -c 3 -p "$BASHPID" 2>/dev/null || true
    TIMINGS=()
    # What `step` recorded, and the step that failed, for the main script to report.
    trap 'rc=$?; printf "%s\n" "${TIMINGS[@]+"${TIMINGS[@]}"}" >"$SIDE_DIR/timings"; echo "$CURRENT_STEP" >"$SIDE_DIR/failed"; exit $rc' EXIT
    step package package_all
    step doctest bounded cargo test --workspace --doc --all-features --no-fail-fast
    step doc env RUSTDOCFLAGS="${RUSTDOCFLAGS:+$RUSTDOCFLAGS }-D warnings" cargo doc --workspace --all-features --no-deps
    # lockcore's docs as its default features build them (docs.rs, a user's `cargo doc`): a
    # link to an item behind a feature only breaks there.
    step doc-lockcore env RUSTDOCFLAGS="${RUSTDOCFLAGS:+$RUSTDOCFLAGS }-D warnings" cargo doc -p distlock-core --no-deps
}

# Waits for side_steps, shows what they printed, and fails if one of them failed.
side_results() {
    local rc=0 line
    wait "$SIDE_PID" || rc=$?
    SIDE_PID=""
    echo
    echo "==> the steps run beside the tests (package, doctest, doc), as they printed:"
    cat "$SIDE_DIR/log"
    while IFS= read -r line; do
        [[ -n "$line" ]] && TIMINGS+=("$line (beside)")
    done <"$SIDE_DIR/timings"
    if ((rc != 0)); then
        CURRENT_STEP="$(cat "$SIDE_DIR/failed")"
        return "$rc"
    fi
}

# Before the servers start: they take a third of a core while idle. The test binaries
# cargo built are listed in test-binaries.json for scripts/run-tests.py.
mkdir -p target
step clippy+build bash -c 'cargo test --workspace --all-targets --all-features --no-run \
    --message-format=json-render-diagnostics >target/test-binaries.json'
SIDE_DIR="$(mktemp -d)"
side_steps >"$SIDE_DIR/log" 2>&1 &
SIDE_PID=$!
step ipc clear_stale_ipc
step "servers start" start_servers
# Four tests at a time in each binary, whatever the cores: many suites mostly wait on the
# stores and on leases running out (etcd's use 30 s of CPU in 67 s), so on 2 cores the
# default of 2 leaves the machine idle; the etcd FIFO suite goes from 182 s to 97 s.
# RUST_TEST_THREADS set by the caller wins.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
# Every binary, each bounded on its own (a hung one is named and killed, and the others
# still run), with the wall and CPU time of each: see scripts/run-tests.py. A failure here
# still shows the side steps' results before the script fails.
CURRENT_STEP=test
echo
echo "==> [test] scripts/run-tests.py --built target/test-binaries.json"
T0="$(now_ms)"
TEST_RC=0
bounded python3 scripts/run-tests.py --built target/test-binaries.json || TEST_RC=$?
timed test "$T0"
SIDE_RC=0
side_results || SIDE_RC=$?
if ((TEST_RC != 0)); then
    if ((SIDE_RC != 0)); then
        CURRENT_STEP="test, and $CURRENT_STEP (beside)"
    else
        CURRENT_STEP=test
    fi
    exit "$TEST_RC"
fi
((SIDE_RC == 0)) || exit "$SIDE_RC"
CURRENT_STEP=""
