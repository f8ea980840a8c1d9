#!/usr/bin/env python3
"""Checks that README.md shows examples/quickstart.cpp verbatim.

  check_readme.py README.md examples/quickstart.cpp

The README's first ```cpp block must equal the file, byte for byte, so the
code a reader copies is the code the test suite compiles and runs.
"""
import difflib
import re
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    readme = open(sys.argv[1], encoding="utf-8").read()
    source = open(sys.argv[2], encoding="utf-8").read()
    m = re.search(r"^```cpp\n(.*?)^```$", readme, re.S | re.M)
    if not m:
        print("FAIL: README.md has no ```cpp block", file=sys.stderr)
        return 1
    if m.group(1) != source:
        diff = difflib.unified_diff(source.splitlines(True), m.group(1).splitlines(True),
                                    sys.argv[2], "README.md")
        sys.stderr.writelines(diff)
        print("FAIL: README.md's code differs from " + sys.argv[2], file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
