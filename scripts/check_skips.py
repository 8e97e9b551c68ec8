#!/usr/bin/env python3
"""check_skips.py BUILD_DIR: every CTest entry of the build reports a skip
as SKIP, never as PASS or FAIL: each has SKIP_RETURN_CODE 77, the status
that tests/itest.c's itest_skip(), the test scripts and the parts of a
suite that this machine or build cannot run (tests/CMakeLists.txt,
slotd_test_part()) exit with.  Reads `ctest --show-only=json-v1`; prints
each entry without it and exits 1 if there is one."""
import json
import subprocess
import sys


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    out = subprocess.run(["ctest", "--test-dir", argv[1], "--show-only=json-v1"],
                         check=True, capture_output=True, text=True).stdout
    tests = json.loads(out)["tests"]
    bad = []
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if str(props.get("SKIP_RETURN_CODE")) != "77":
            bad.append(t["name"])
    for name in bad:
        print("%s: no SKIP_RETURN_CODE 77: a skip would count as %s" % (name, "a failure"))
    if bad or not tests:
        return 1
    print("all %d tests report a skip as SKIP" % len(tests))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
