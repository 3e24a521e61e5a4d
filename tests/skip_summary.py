#!/usr/bin/env python3
"""Summarises a ctest run from its JUnit file: how many cases passed,
failed, were skipped (and why), or were not run.

    tests/skip_summary.py RESULTS.xml      (ctest --output-junit RESULTS.xml)

ctest's own last line counts a skipped case among the passed ones
("100% tests passed"); this prints the four counts apart, then each skip
reason (the case's "SKIP: ..." line, tests/harness.h and tests/skip.sh)
with how many cases gave it and the first of them.  A case skipped with
SKIP_RETURN_CODE is "skipped"; a case ctest did not start because a
fixture it needs failed is "not run" and counts as failed.  Always exits 0:
ctest's exit status is the verdict.
"""
import sys
import xml.etree.ElementTree as ET


def skip_reason(case):
    out = case.findtext("system-out") or ""
    for line in out.splitlines():
        if line.startswith("SKIP: "):
            return line[len("SKIP: "):].strip()
    return "(exit 77 without a SKIP: line)"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print("skip_summary: cannot read %s: %s" % (sys.argv[1], e))
        return
    passed, failed, notrun = 0, [], []
    reasons = {}
    for case in root.iter("testcase"):
        name = case.get("name")
        status = case.get("status")
        sk = case.find("skipped")
        if status == "run":
            passed += 1
        elif status == "fail":
            failed.append(name)
        elif sk is not None and sk.get("message", "").startswith(
                "SKIP_RETURN_CODE"):
            reasons.setdefault(skip_reason(case), []).append(name)
        else:
            notrun.append(name)
    skipped = sum(len(v) for v in reasons.values())
    total = passed + len(failed) + skipped + len(notrun)
    print("tests: %d passed, %d skipped, %d failed, %d not run (of %d)" %
          (passed, skipped, len(failed), len(notrun), total))
    for why, names in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        more = " and %d more" % (len(names) - 1) if len(names) > 1 else ""
        print("  skipped %4d: %s  [%s%s]" % (len(names), why, names[0], more))
    for name in notrun:
        print("  not run: %s (a fixture it needs failed)" % name)


if __name__ == "__main__":
    main()
