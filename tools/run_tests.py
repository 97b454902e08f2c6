#!/usr/bin/env python3
"""Suite driver for `make test` (stdlib only).

Runs every unit-test executable in build/tests/, then the ASan+UBSan builds
in build/asan/tests/, then `python3 -m pytest -q tests/` with Q3MOE and
Q3MOE_ASAN pointing at the built binaries. Arguments are passed to pytest
(e.g. `tools/run_tests.py -k bad_input`). Unit tests always run in full.

Each unit test prints "N passed, N failed" as its last stdout line
(tests/unit/unit.h). A crash, a non-zero exit, a missing summary, a run
with no checks or a sanitizer report counts as one more failure. The last
line printed here is always "N passed, N failed" over everything, and the
exit status is non-zero when anything failed or nothing ran.
"""
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"
UNIT_TIMEOUT_S = 900
OUTPUT_TAIL_LINES = 150

SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
UNIT_SUMMARY = re.compile(r"^\s*(\d+) passed, (\d+) failed\s*$")
SANITIZER_MARKS = ("Sanitizer", "runtime error:")


class Group:
    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures = []  # names of failing programs / tests
        self.note = ""

    def line(self):
        s = f"{self.passed} passed, {self.failed} failed"
        if self.skipped:
            s += f", {self.skipped} skipped"
        if self.note:
            s += f" ({self.note})"
        return s


def tail(text, n=OUTPUT_TAIL_LINES):
    lines = text.rstrip("\n").splitlines()
    if len(lines) > n:
        lines = [f"... ({len(lines) - n} earlier lines omitted)"] + lines[-n:]
    return "\n".join(lines)


def executables(folder):
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            out.append(path)
    return out


def describe_rc(rc):
    if rc < 0:
        try:
            import signal

            return f"killed by {signal.Signals(-rc).name}"
        except (ValueError, ImportError):
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def run_unit_group(group, folder, extra_env, check_sanitizer):
    progs = executables(folder)
    rel = os.path.relpath(folder, ROOT)
    print(f"== {group.name}: {len(progs)} program(s) in {rel}/", flush=True)
    if not progs:
        group.note = f"nothing in {rel}/"
        return
    env = dict(os.environ)
    env.update(extra_env)
    width = max(len(os.path.basename(p)) for p in progs)
    for prog in progs:
        name = os.path.basename(prog)
        start = time.monotonic()
        try:
            proc = subprocess.run([prog], cwd=ROOT, env=env, capture_output=True,
                                  timeout=UNIT_TIMEOUT_S)
            rc = proc.returncode
            stdout = proc.stdout.decode("utf-8", "replace")
            stderr = proc.stderr.decode("utf-8", "replace")
            timed_out = False
        except subprocess.TimeoutExpired as e:
            rc = None
            stdout = (e.stdout or b"").decode("utf-8", "replace")
            stderr = (e.stderr or b"").decode("utf-8", "replace")
            timed_out = True
        secs = time.monotonic() - start

        summary = None
        for line in reversed(stdout.splitlines()):
            m = UNIT_SUMMARY.match(line)
            if m:
                summary = (int(m.group(1)), int(m.group(2)))
                break
        problems = []
        passed, failed = summary if summary else (0, 0)
        if timed_out:
            problems.append(f"timed out after {UNIT_TIMEOUT_S}s")
        elif rc != 0:
            problems.append(describe_rc(rc))
        if summary is None:
            problems.append("no 'N passed, N failed' line on stdout")
        elif passed + failed == 0:
            problems.append("no checks ran")
        if check_sanitizer and any(mark in stderr for mark in SANITIZER_MARKS):
            problems.append("sanitizer report")
        # A program that failed without failing a check still counts once.
        if problems and failed == 0:
            failed = 1

        group.passed += passed
        group.failed += failed
        status = "FAIL" if (failed or problems) else "ok"
        counts = f"{summary[0]} passed, {summary[1]} failed" if summary else "no summary"
        extra = f"  [{'; '.join(problems)}]" if problems else ""
        print(f"  {status:4} {name:{width}}  {counts}  ({secs:.1f}s){extra}", flush=True)
        if status == "FAIL":
            group.failures.append(name)
            print(f"---- {name} stdout ----\n{tail(stdout)}")
            print(f"---- {name} stderr ----\n{tail(stderr)}")
            print(f"---- end of {name} ----", flush=True)


PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
PYTEST_SUMMARY = re.compile(r"\bin [\d.]+s\b|no tests ran")


def parse_pytest_summary(output):
    """Counts from pytest's last summary line, e.g. "3 failed, 10 passed,
    1 skipped, 2 errors in 4.20s" (with or without '=' borders). None if
    there is no such line."""
    for line in reversed(output.splitlines()):
        text = line.strip().strip("=").strip()
        if not PYTEST_SUMMARY.search(text):
            continue
        counts = {}
        for n, kind in PYTEST_COUNT.findall(text):
            kind = "error" if kind.startswith("error") else kind
            counts[kind] = counts.get(kind, 0) + int(n)
        if counts or "no tests ran" in text:
            return counts
    return None


def run_pytest(group, args):
    env = dict(os.environ)
    env.update(SAN_ENV)
    env["Q3MOE"] = os.path.join(ROOT, "build", "q3moe")
    env["Q3MOE_ASAN"] = os.path.join(ROOT, "build", "asan", "q3moe")
    cmd = [PYTHON, "-m", "pytest", "-q", "tests/"] + args
    print(f"== {group.name}: {' '.join(cmd[1:])}", flush=True)
    # Stream pytest's own output (it already shows each failure) and keep a
    # copy to parse the summary.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    chunks = []
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        chunks.append(line)
        sys.stdout.write(line)
        sys.stdout.flush()
    rc = proc.wait()
    counts = parse_pytest_summary("".join(chunks))
    if counts is not None:
        group.passed = counts.get("passed", 0) + counts.get("xfailed", 0)
        group.failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("xpassed", 0)
        group.skipped = counts.get("skipped", 0)
    # 0: all passed, 1: some failed, 5: nothing collected (e.g. -k matched
    # nothing). Anything else (interrupted, usage or internal error), or a
    # failure exit with no failure counted, is a failure of its own.
    problem = None
    if rc == 5:
        pass
    elif counts is None:
        problem = f"pytest exit status {rc}, no summary line"
    elif rc not in (0, 1) or (rc == 1 and group.failed == 0):
        problem = f"pytest exit status {rc}"
    if problem:
        group.failed += 1
        group.note = problem
    if group.failed:
        group.failures.append("pytest")


def main(argv):
    os.chdir(ROOT)
    unit = Group("unit")
    asan = Group("unit-asan")
    pyt = Group("pytest")
    run_unit_group(unit, os.path.join(ROOT, "build", "tests"), {}, False)
    print()
    run_unit_group(asan, os.path.join(ROOT, "build", "asan", "tests"), SAN_ENV, True)
    print()
    run_pytest(pyt, argv)
    print()

    groups = (unit, asan, pyt)
    passed = sum(g.passed for g in groups)
    failed = sum(g.failed for g in groups)
    print("== summary")
    for g in groups:
        print(f"  {g.name:10} {g.line()}")
        if g.failures:
            print(f"  {'':10} failing: {', '.join(g.failures)}")
    if passed + failed == 0:
        print("  no test ran")
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed or passed + failed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
