#!/usr/bin/env python3
"""Builds the workspace's test binaries and runs them one after another, as `cargo test`
does, each bounded on its own, and says what each took.

    scripts/run-tests.py [--timeout SECONDS] [CARGO_TEST_ARGS...]
    scripts/run-tests.py [--timeout SECONDS] --built FILE

CARGO_TEST_ARGS select what `cargo test` would build and run (default: `--workspace
--all-targets --all-features`). With --built, the binaries are those of FILE, what `cargo
test --no-run --message-format=json-render-diagnostics` printed on its standard output, and
nothing is built (so cargo's lock on target/ is not needed). Each binary runs with the working directory and environment
`cargo test` gives it. Prints every failing binary's whole output, and of the others their
result lines and what they ignored; then the binaries that took longest, with the CPU time
they and the servers they started used. Exits 1 if any binary failed or ran out of time.

Why not `cargo test`: under CI's bound on the whole step, a slow or hung binary ends the run
with no word of which one it was or how long the others took. Here a binary out of time is
killed and named, and the others still run.

Why not cargo-nextest: it runs every test in a process of its own, and several of our test
files rely on being one process: tests that take turns on a static mutex (the Redis Cluster
topology tests), a data directory made once per process and copied for each server (the
SQL servers).

Why one binary at a time: the suites are not idle. Side by side they loaded the 2 cores to
a load average of 18 (three at a time) and failed tests on leases that ran out under load
(two at a time: 711 s instead of about 960 s, with 3 tests failing).
"""

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time


def build(cargo_args):
    """Builds the test binaries; returns what `binaries` finds in cargo's messages."""
    cmd = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics"]
    cmd += cargo_args
    print("==> " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    found = binaries(proc.stdout)
    if proc.wait() != 0:
        sys.exit(proc.returncode)
    return found


def binaries(messages):
    """(package, target, executable, package dir) of each test binary in cargo's JSON
    messages (`--message-format=json...`), in cargo's order."""
    found = []
    for line in messages:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        exe = msg.get("executable")
        if not exe or not msg["profile"]["test"]:
            continue
        target = msg["target"]
        kinds = target["kind"]
        src = os.path.relpath(target["src_path"], os.path.dirname(msg["manifest_path"]))
        what = f"unittests {src}" if "lib" in kinds or "bin" in kinds else src
        package = package_name(msg["package_id"])
        found.append((package, what, exe, os.path.dirname(msg["manifest_path"])))
    return found


def package_name(package_id):
    """`path+file:///work/lockcore#distlock-core@0.1.0` (or the older
    `distlock-core 0.1.0 (path+file:///...)`) -> `distlock-core`."""
    if " " in package_id:
        return package_id.split(" ", 1)[0]
    tail = package_id.rsplit("#", 1)[-1]
    return tail.split("@", 1)[0]


class Result:
    def __init__(self, package, what, seconds, status, output, cpu):
        self.package = package
        self.what = what
        self.seconds = seconds
        self.status = status  # "ok", "FAILED" or "TIMED OUT"
        self.output = output
        self.cpu = cpu


def run_binary(package, what, exe, cwd, timeout):
    env = dict(os.environ)
    env["CARGO_MANIFEST_DIR"] = cwd
    env["CARGO_PKG_NAME"] = package
    started = time.monotonic()
    # A session of its own, so that a binary out of time is killed with what it started.
    proc = subprocess.Popen(
        [exe],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    # Read the output and reap the binary here, not with communicate(): wait4 gives the CPU
    # time it and the servers it started and reaped used, which tells what loads the machine;
    # and a process it left behind that still holds the pipe must not stall the run.
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    chunks = []
    status = usage = None
    deadline = started + timeout
    eof = False
    while status is None:
        eof = eof or read_ready(fd, chunks, 0.05)
        pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status = "ok" if os.waitstatus_to_exitcode(code) == 0 else "FAILED"
        elif time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            _, code, usage = os.wait4(proc.pid, 0)
            status = "TIMED OUT"
    proc.returncode = os.waitstatus_to_exitcode(code)
    # What it wrote before it ended; at most 2 s more for a leftover child's last lines.
    drain_until = time.monotonic() + 2
    while not eof and time.monotonic() < drain_until:
        eof = read_ready(fd, chunks, 0.05)
    proc.stdout.close()
    out = b"".join(chunks)
    if status == "TIMED OUT":
        out += f"\n(killed after {timeout:.0f} s)\n".encode()
    return Result(package, what, time.monotonic() - started, status,
                  out.decode("utf-8", "replace"), usage.ru_utime + usage.ru_stime)


def read_ready(fd, chunks, wait):
    """Appends what `fd` has within `wait` seconds to `chunks`; True at end of file."""
    readable, _, _ = select.select([fd], [], [], wait)
    if not readable:
        return False
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            return True
        chunks.append(data)


def report(result):
    """What a binary printed: all of it if it failed, else its result and ignored lines."""
    print(f"\n==> {result.package} {result.what}: {result.status} in {result.seconds:.1f} s "
          f"({result.cpu:.1f} s of CPU)")
    if result.status != "ok":
        print(result.output, end="" if result.output.endswith("\n") else "\n")
    else:
        for line in result.output.splitlines():
            if line.startswith("test result:") or " ... ignored" in line:
                print("    " + line)
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(add_help=True)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one binary may run before it is killed (default 600)")
    parser.add_argument("--built", metavar="FILE",
                        help="run the binaries of this output of `cargo test --no-run "
                        "--message-format=json...` instead of building")
    args, cargo_args = parser.parse_known_args()
    if not cargo_args:
        cargo_args = ["--workspace", "--all-targets", "--all-features"]

    t0 = time.monotonic()
    if args.built:
        with open(args.built) as messages:
            found = binaries(messages)
        print(f"==> {len(found)} test binaries built by cargo, from {args.built}", flush=True)
    else:
        found = build(cargo_args)
        print(f"==> built {len(found)} test binaries in {time.monotonic() - t0:.1f} s",
              flush=True)

    t1 = time.monotonic()
    results = []
    for package, what, exe, cwd in found:
        result = run_binary(package, what, exe, cwd, args.timeout)
        report(result)
        results.append(result)

    counts = {"passed": 0, "failed": 0, "ignored": 0}
    for r in results:
        for line in r.output.splitlines():
            if line.startswith("test result:"):
                for part in line.split(";"):
                    words = part.replace("test result: ok.", "").replace(
                        "test result: FAILED.", "").split()
                    if len(words) >= 2 and words[1] in counts:
                        counts[words[1]] += int(words[0])
    print(f"\n==> {len(results)} binaries in {time.monotonic() - t1:.1f} s: "
          f"{counts['passed']} passed, {counts['failed']} failed, {counts['ignored']} ignored")
    cpu = sum(r.cpu for r in results)
    print(f"==> the longest (of {cpu:.0f} s of CPU in all):")
    for r in sorted(results, key=lambda r: -r.seconds)[:12]:
        print(f"    {r.seconds:7.1f} s  {r.cpu:6.1f} s CPU  {r.package} {r.what}")
    bad = [r for r in results if r.status != "ok"]
    if bad:
        print("==> failed:")
        for r in bad:
            print(f"    {r.status}: {r.package} {r.what}")
        sys.exit(1)


if __name__ == "__main__":
    main()
