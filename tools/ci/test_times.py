#!/usr/bin/env python3
"""Where a ctest run's time went: the slowest tests, and test time per label and per suite.

    tools/ci/test_times.py BUILD_DIR [--junit FILE | --ctest-log FILE] [--top N] [--output FILE]

Reads each ctest entry's time and result from the JUnit file ctest wrote
(`ctest --output-junit FILE`; default BUILD_DIR/test-results.xml, which `make
test` writes; `make test-long` writes test-results-long.xml), or from a saved
console log of ctest (--ctest-log), and asks ctest (`ctest --show-only=json-v1`)
for each entry's labels and command. An entry runs one gtest suite, or one
long test (tests/support/discover_tests.cmake); the gtest XML report its
command names gives each test's own time, for the table of slowest tests.
Prints markdown and, with --output, writes it there too (.ci/run keeps one
per suite beside each build).

Times per label and per suite are ctest's, per process, start-up included
(about 0.6 s a process for loading libtorch); a run with -j2 spends about half
the summed time in wall time.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree


def read_junit(path):
    """{entry: (seconds, status)} from ctest's JUnit output."""
    out = {}
    for case in ElementTree.parse(path).iter("testcase"):
        seconds = float(case.get("time") or 0.0)
        if case.find("failure") is not None or case.find("error") is not None:
            status = "failed"
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            status = "skipped"
        else:
            status = "passed"
        name = case.get("name")
        if name in out:
            # Two test binaries with a gtest suite of one name: ctest runs
            # both under it, and neither can be told apart (ctest -R).
            print(f"test_times: two ctest entries are named {name}: rename one of the gtest suites",
                  file=sys.stderr)
        out[name] = (seconds, status)
    return out


def read_console_log(path):
    """The same from ctest's console output ("12/839 Test  #12: Name .... Passed 1.53 sec")."""
    line_re = re.compile(r"^\s*\d+/\d+ Test +#\d+: (.+?) \.+\s*\**(\w[\w ]*?)\s+([0-9.]+) sec")
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = line_re.match(line)
            if not m:
                continue
            word = m.group(2).strip().lower()
            status = word if word in ("passed", "skipped") else "failed"
            out[m.group(1)] = (float(m.group(3)), status)
    return out


def read_listing(build_dir):
    """{entry: (labels, gtest XML path or None)}, from ctest's own listing of the build folder."""
    listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, check=True,
                             capture_output=True, text=True).stdout
    out = {}
    for test in json.loads(listing).get("tests", []):
        labels = []
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                labels = list(prop.get("value") or [])
        report = None
        for arg in test.get("command", []):
            if arg.startswith("--gtest_output=xml:"):
                report = arg[len("--gtest_output=xml:"):]
        out[test["name"]] = (labels, report)
    return out


def read_gtest_cases(report):
    """[(Suite.Name, seconds, status)] from one gtest XML report."""
    cases = []
    for suite in ElementTree.parse(report).iter("testsuite"):
        for case in suite.iter("testcase"):
            if case.get("result") == "skipped" or case.find("skipped") is not None:
                status = "skipped"
            elif case.find("failure") is not None:
                status = "failed"
            else:
                status = "passed"
            cases.append((f"{suite.get('name')}.{case.get('name')}", float(case.get("time") or 0.0), status))
    return cases


def suite_of(name):
    """gtest's suite of an entry or test name, without a parameterised suite's "Prefix/"."""
    return name.split(".", 1)[0].split("/")[-1]


def duration(seconds):
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def tables(entries, listing, top):
    total = sum(s for s, _ in entries.values())
    counts = collections.Counter(status for _, status in entries.values())
    lines = [f"{len(entries)} ctest entries, {counts['passed']} passed, {counts['skipped']} skipped, "
             f"{counts['failed']} failed; {duration(total)} of test time in all", ""]

    # Each test's own time, where the entries' gtest reports are there.
    cases = []
    for name, (_, status) in entries.items():
        labels, report = listing.get(name, ([], None))
        if status != "skipped" and report and os.path.exists(report):
            cases += [(case, seconds, case_status, labels) for case, seconds, case_status in read_gtest_cases(report)]
    if cases:
        lines += [f"{len(cases)} tests ran in them. The slowest {top} (gtest's time of each, start-up not included):",
                  "", "| # | test | labels | seconds |", "|---|---|---|---|"]
        for i, (case, seconds, status, labels) in enumerate(sorted(cases, key=lambda c: -c[1])[:top], 1):
            note = "" if status == "passed" else f" ({status})"
            lines.append(f"| {i} | {case}{note} | {', '.join(labels)} | {seconds:.1f} |")
    else:
        lines += [f"The slowest {top} entries:", "", "| # | entry | labels | seconds |", "|---|---|---|---|"]
        ranked = sorted(entries.items(), key=lambda kv: -kv[1][0])
        for i, (name, (seconds, status)) in enumerate(ranked[:top], 1):
            note = "" if status == "passed" else f" ({status})"
            lines.append(f"| {i} | {name}{note} | {', '.join(listing.get(name, ([], None))[0])} | {seconds:.1f} |")

    def grouped(title, keys_of):
        groups = collections.defaultdict(lambda: [0.0, 0])
        for name, (seconds, _) in entries.items():
            for key in keys_of(name):
                groups[key][0] += seconds
                groups[key][1] += 1
        rows = ["", title, "", "| | entries | test time | share |", "|---|---|---|---|"]
        for key, (seconds, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
            rows.append(f"| {key} | {n} | {duration(seconds)} | {100 * seconds / max(total, 1e-9):.1f}% |")
        return rows

    lines += grouped("Test time per label (ctest's, per process)",
                     lambda name: listing.get(name, ([], None))[0] or ["(none)"])
    lines += grouped("Test time per suite (ctest's, per process)", lambda name: [suite_of(name)])
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build_dir")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--junit", help="ctest's JUnit file (default BUILD_DIR/test-results.xml)")
    source.add_argument("--ctest-log", help="a saved console output of ctest, read instead")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--output", help="also write the tables to this file")
    args = parser.parse_args()
    if args.ctest_log:
        entries = read_console_log(args.ctest_log)
    else:
        junit = args.junit or os.path.join(args.build_dir, "test-results.xml")
        if not os.path.exists(junit):
            print(f"test_times: {junit}: no such file (ctest writes it with --output-junit, as `make test` "
                  "does; or pass --ctest-log)", file=sys.stderr)
            return 2
        entries = read_junit(junit)
    text = tables(entries, read_listing(args.build_dir), args.top)
    sys.stdout.write(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
