#!/usr/bin/env python3
"""Prints the N slowest test cases of a JUnit XML report (cargo-nextest's and pytest's
both write one), so each `make test` run shows where the suite's time goes.

    scripts/slowest-tests.py TITLE REPORT.xml [N]
"""
import sys
import xml.etree.ElementTree as ET


def cases(path):
    """(seconds, name) of every test case in the report."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        cls = case.get("classname")
        out.append((float(case.get("time") or 0), f"{cls}::{name}" if cls else name))
    return out


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip())
    title, path = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) == 4 else 20
    try:
        found = cases(path)
    except (OSError, ET.ParseError) as e:
        sys.exit(f"slowest-tests: cannot read {path}: {e}")
    found.sort(reverse=True)
    total = sum(t for t, _ in found)
    print(f"\n== {title}: {len(found)} tests, {total:.0f} s summed; the {min(n, len(found))} slowest ==")
    for t, name in found[:n]:
        print(f"{t:8.1f} s  {name}")


if __name__ == "__main__":
    main()
