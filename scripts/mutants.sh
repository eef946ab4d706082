#!/usr/bin/env bash
# The mutation audit: applies each hand-written mutant of mutants/*.patch to a scratch copy
# of the tree, runs the tests its header names against the real servers, and prints a table.
#
#   scripts/mutants.sh [options] [ID...]
#
#   ID...              run only these mutants, in this order (default: all of
#                      mutants/*.patch, in name order)
#   --crate NAME       run only the mutants of crate NAME (repeatable)
#   --list             list the mutants (id, crate, description, test command) and exit
#   --no-baseline      skip the baseline run of each distinct test command on the
#                      unmutated tree (by default it runs first, so a flaky or broken test
#                      is not counted as a kill: mutants whose command fails its baseline
#                      twice are reported `no-baseline` and left out of the score)
#   --baseline-only    only run the baselines of the selected mutants' test commands
#   --timeout SECS     bound on one mutant's test run, after its build (default 900)
#   --keep-target      keep the scratch tree's target dir when the audit ends (by default it
#                      is removed: it starts as a copy of target/debug, tens of GB, and a
#                      full disk failed a CI run once)
#   -h, --help         this text
#
# Each patch is a unified diff against the tree (applied with `git apply`) after a header:
#
#   # id: redis-release-no-owner-check
#   # crate: distlock-redis
#   # description: release script deletes the lock without checking the owner
#   # test: cargo test -p distlock-redis --lib --test conformance --test redis
#
# Results: `killed` (the tests failed), `survived` (they passed), `timeout` (counted as
# killed, shown apart), `stale` (the patch no longer applies) and `build-error` (the mutant
# does not compile): the last two are left out of the score `killed/valid`.
#
# The scratch copy is a detached git worktree at target/mutants/tree, checked out at this
# checkout's HEAD (commit first: uncommitted changes are not audited), with its own target
# dir seeded from target/debug, so each mutant rebuilds incrementally (removed at the end
# unless --keep-target). The servers:
# target/test-servers.env (or $DISTLOCK_TEST_SERVERS_DIR.env) if it exists, else the script
# starts them with scripts/servers.sh and stops them when it exits. The table is also written
# to target/mutants/report.md, and each run's output to target/mutants/logs/ID.log.
#
# Not part of scripts/test.sh or CI: the whole audit takes tens of minutes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MUTANTS_DIR="$ROOT/mutants"
WORK="$ROOT/target/mutants"
TREE="$WORK/tree"
LOGS="$WORK/logs"
REPORT="$WORK/report.md"
STATE_DIR="${DISTLOCK_TEST_SERVERS_DIR:-$ROOT/target/test-servers}"
ENV_FILE="${STATE_DIR%/}.env"

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
log() { printf 'mutants.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 2
}
now_s() { date +%s; }

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------

LIST=0
BASELINE=1
TIMEOUT_S=900
KEEP_TARGET=0
CRATES=()
IDS=()
while (($# > 0)); do
    case "$1" in
    --list) LIST=1 ;;
    --no-baseline) BASELINE=0 ;;
    --keep-target) KEEP_TARGET=1 ;;
    --baseline-only) BASELINE=2 ;;
    --crate)
        (($# >= 2)) || die "--crate needs a crate name"
        CRATES+=("$2")
        shift
        ;;
    --timeout)
        (($# >= 2)) || die "--timeout needs a number of seconds"
        [[ "$2" =~ ^[0-9]+$ ]] || die "--timeout needs a number of seconds, not $2"
        TIMEOUT_S="$2"
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) IDS+=("$1") ;;
    esac
    shift
done

# header FILE FIELD: the value of `# FIELD: value` in the patch's header.
header() {
    sed -n "s/^# $2: //p" "$1" | head -n 1
}

# The selected patches: in the order given when IDs are given, else in name order.
SELECTED=()
shopt -s nullglob
CANDIDATES=("$MUTANTS_DIR"/*.patch)
if ((${#IDS[@]} > 0)); then
    CANDIDATES=()
    for w in "${IDS[@]}"; do CANDIDATES+=("$MUTANTS_DIR/$w.patch"); done
fi
for patch in "${CANDIDATES[@]}"; do
    [[ -f "$patch" ]] || die "no mutant $(basename "$patch" .patch) (see --list)"
    id="$(header "$patch" id)"
    crate="$(header "$patch" crate)"
    [[ -n "$id" && -n "$crate" && -n "$(header "$patch" test)" ]] ||
        die "$patch: the header needs id, crate, description and test lines"
    [[ "$id" == "$(basename "$patch" .patch)" ]] || die "$patch: id $id is not the file name"
    if ((${#CRATES[@]} > 0)); then
        wanted=0
        for w in "${CRATES[@]}"; do [[ "$w" == "$crate" ]] && wanted=1; done
        ((wanted)) || continue
    fi
    SELECTED+=("$patch")
done
shopt -u nullglob
((${#SELECTED[@]} > 0)) || die "no mutant selected"

if ((LIST)); then
    printf '%-36s %-15s %s\n' ID CRATE DESCRIPTION
    for patch in "${SELECTED[@]}"; do
        printf '%-36s %-15s %s\n' "$(header "$patch" id)" "$(header "$patch" crate)" \
            "$(header "$patch" description)"
        printf '%-36s %-15s   test: %s\n' "" "" "$(header "$patch" test)"
    done
    exit 0
fi

# ---------------------------------------------------------------------------------------------
# Scratch tree and servers
# ---------------------------------------------------------------------------------------------

T_START="$(now_s)"
HEAD_COMMIT="$(git -C "$ROOT" rev-parse HEAD)"
if [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]]; then
    log "warning: uncommitted changes in $ROOT are not audited (the scratch tree is at HEAD)"
fi
mkdir -p "$WORK" "$LOGS"
if [[ ! -e "$TREE/.git" ]]; then
    log "creating the scratch worktree $TREE"
    git -C "$ROOT" worktree add --detach "$TREE" "$HEAD_COMMIT" >/dev/null
fi
git -C "$TREE" reset -q --hard
git -C "$TREE" checkout -q --detach "$HEAD_COMMIT"
if [[ ! -d "$TREE/target/debug" && -d "$ROOT/target/debug" ]]; then
    log "seeding $TREE/target/debug from target/debug (once)"
    mkdir -p "$TREE/target"
    rsync -a --exclude incremental "$ROOT/target/debug" "$TREE/target/" || true
fi
export CARGO_TARGET_DIR="$TREE/target"

SERVERS_STARTED=0
cleanup() {
    local rc=$?
    git -C "$TREE" reset -q --hard 2>/dev/null || true
    if ((!KEEP_TARGET)) && [[ -d "$TREE/target" ]]; then
        log "removing $TREE/target ($(du -sh "$TREE/target" 2>/dev/null | cut -f1); --keep-target keeps it)"
        rm -rf "$TREE/target"
    fi
    if ((SERVERS_STARTED)); then
        "$ROOT/scripts/servers.sh" stop || true
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ ! -f "$ENV_FILE" ]]; then
    log "no $ENV_FILE: starting the test servers"
    SERVERS_STARTED=1
    "$ROOT/scripts/servers.sh" start
fi
# shellcheck disable=SC1090
source "$ENV_FILE"

# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------

# The build-only form of a test command: `cargo test --no-run`, test filters dropped.
build_form() {
    sed -E 's/cargo test/cargo test --no-run/g; s/ -- [^&;]*//g' <<<"$1"
}

# run_tests LOG COMMAND: builds, then runs COMMAND in the scratch tree; prints
# build-error, pass, fail or timeout.
run_tests() {
    local logfile="$1" cmd="$2" rc=0
    (cd "$TREE" && bash -c "$(build_form "$cmd")") >"$logfile" 2>&1 || rc=$?
    if ((rc != 0)); then
        echo build-error
        return
    fi
    (cd "$TREE" && timeout --kill-after=30 "$TIMEOUT_S" bash -c "$cmd") >>"$logfile" 2>&1 || rc=$?
    case "$rc" in
    0) echo pass ;;
    124 | 137) echo timeout ;;
    *) echo fail ;;
    esac
}

# The first failing test named in a log, for the table.
first_failure() {
    local name
    name="$(grep -m 1 -oE '^test [^ ]+ \.\.\. FAILED' "$1" | sed -E 's/^test //; s/ \.\.\. FAILED$//' || true)"
    printf '%s' "${name:-}"
}

declare -A BASE_RESULT=()
BASELINE_ROWS=()
if ((BASELINE)); then
    declare -A seen=()
    n_cmd=0
    for patch in "${SELECTED[@]}"; do
        cmd="$(header "$patch" test)"
        [[ -n "${seen[$cmd]:-}" ]] && continue
        seen[$cmd]=1
        n_cmd=$((n_cmd + 1))
        t0="$(now_s)"
        log "baseline $n_cmd: $cmd"
        result="$(run_tests "$LOGS/baseline-$n_cmd.log" "$cmd")"
        if [[ "$result" != pass ]]; then
            log "baseline $n_cmd: $result; once more (see $LOGS/baseline-$n_cmd.log)"
            cp "$LOGS/baseline-$n_cmd.log" "$LOGS/baseline-$n_cmd.first.log"
            result="$(run_tests "$LOGS/baseline-$n_cmd.log" "$cmd")"
            [[ "$result" == pass ]] && result="flaky (failed once: $(first_failure "$LOGS/baseline-$n_cmd.first.log"))"
        fi
        BASE_RESULT[$cmd]="$result"
        BASELINE_ROWS+=("$(printf '| `%s` | %s | %s |' "$cmd" "$result" "$(($(now_s) - t0))")")
        log "baseline $n_cmd: $result in $(($(now_s) - t0)) s"
    done
fi

if ((BASELINE == 2)); then
    {
        echo "# Baselines"
        echo
        echo "Run $(date -u +%Y-%m-%dT%H:%MZ) on commit \`${HEAD_COMMIT:0:7}\`; wall time $(($(now_s) - T_START)) s."
        echo
        echo "| test command | result | seconds |"
        echo "|---|---|---|"
        printf '%s\n' "${BASELINE_ROWS[@]}"
    } >"$WORK/baseline.md"
    log "baselines written to $WORK/baseline.md"
    exit 0
fi

# Writes the report (after every mutant, so an interrupted run still leaves one).
report() {
    VALID=$((KILLED + TIMEOUTS + SURVIVED))
    SCORE="$((KILLED + TIMEOUTS))/$VALID"
    PCT="$(awk -v k=$((KILLED + TIMEOUTS)) -v v="$VALID" 'BEGIN { if (v) printf "%.1f", 100 * k / v; else print "n/a" }')"
    WALL=$(($(now_s) - T_START))
    {
        echo "# Mutation audit"
        echo
        echo "Run $(date -u +%Y-%m-%dT%H:%MZ) on commit \`${HEAD_COMMIT:0:7}\`, $(nproc) cores; ${#ROWS[@]} of ${#SELECTED[@]} selected mutants run; wall time ${WALL} s."
        echo
        echo "**Score: $SCORE killed ($PCT%)** — $KILLED killed, $TIMEOUTS timeout, $SURVIVED survived, $EXCLUDED excluded (stale, build-error or no-baseline)."
        echo
        if ((${#BASELINE_ROWS[@]} > 0)); then
            echo "Baselines (unmutated tree):"
            echo
            echo "| test command | result | seconds |"
            echo "|---|---|---|"
            printf '%s\n' "${BASELINE_ROWS[@]}"
            echo
        fi
        echo "| id | crate | description | result | seconds | first failing test |"
        echo "|---|---|---|---|---|---|"
        local row id crate desc result secs by
        for row in "${ROWS[@]+"${ROWS[@]}"}"; do
            IFS=$'\t' read -r id crate desc result secs by <<<"$row"
            echo "| $id | $crate | $desc | $result | $secs | ${by:+\`$by\`} |"
        done
    } >"$REPORT"
}

print_table() {
    local row id crate desc result secs by
    echo
    printf '%-36s %-15s %-11s %6s  %s\n' ID CRATE RESULT SECONDS DESCRIPTION
    for row in "${ROWS[@]}"; do
        IFS=$'\t' read -r id crate desc result secs by <<<"$row"
        printf '%-36s %-15s %-11s %6s  %s\n' "$id" "$crate" "$result" "$secs" "$desc"
    done
    echo
    echo "score: $SCORE killed ($PCT%): $KILLED killed, $TIMEOUTS timeout, $SURVIVED survived, $EXCLUDED stale/build-error/no-baseline; wall time ${WALL} s"
}

ROWS=()
KILLED=0
SURVIVED=0
TIMEOUTS=0
EXCLUDED=0
for patch in "${SELECTED[@]}"; do
    id="$(header "$patch" id)"
    crate="$(header "$patch" crate)"
    desc="$(header "$patch" description)"
    cmd="$(header "$patch" test)"
    logfile="$LOGS/$id.log"
    t0="$(now_s)"
    git -C "$TREE" reset -q --hard
    by=""
    if [[ -n "${BASE_RESULT[$cmd]:-}" && "${BASE_RESULT[$cmd]}" != pass && "${BASE_RESULT[$cmd]}" != flaky* ]]; then
        result=no-baseline
    elif ! git -C "$TREE" apply --check "$patch" >"$logfile" 2>&1; then
        result=stale
    else
        git -C "$TREE" apply "$patch"
        case "$(run_tests "$logfile" "$cmd")" in
        pass) result=survived ;;
        fail)
            result=killed
            by="$(first_failure "$logfile")"
            ;;
        timeout) result=timeout ;;
        build-error) result=build-error ;;
        esac
        git -C "$TREE" reset -q --hard
    fi
    case "$result" in
    killed) KILLED=$((KILLED + 1)) ;;
    timeout) TIMEOUTS=$((TIMEOUTS + 1)) ;;
    survived) SURVIVED=$((SURVIVED + 1)) ;;
    *) EXCLUDED=$((EXCLUDED + 1)) ;;
    esac
    secs=$(($(now_s) - t0))
    log "$(printf '%-36s %-11s %4d s %s' "$id" "$result" "$secs" "$by")"
    ROWS+=("$id"$'\t'"$crate"$'\t'"$desc"$'\t'"$result"$'\t'"$secs"$'\t'"$by")
    report
done

report
print_table
log "report written to $REPORT"
