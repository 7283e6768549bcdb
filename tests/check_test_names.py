#!/usr/bin/env python3
"""CTest `catch_test_names`: every Catch2 test case name must survive catch_discover_tests.

CTest keeps test names in CMake lists, so a ';' inside a TEST_CASE name splits it into two CTest
tests whose filters match no case: Catch then runs nothing and CTest reports a pass (19 cases
once were silently skipped that way). A leading '-' or a '[' is read as an option or a
tag. Usage: check_test_names.py TESTS_DIR. Exit 1 naming each offending case."""
import pathlib
import re
import sys

bad = []
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.cpp")):
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for name in re.findall(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"', line):
            if ";" in name or name.startswith("-") or name.startswith("["):
                bad.append(f"{path}:{number}: TEST_CASE(\"{name}\"): no ';', leading '-' or '[' in a test name")
print("\n".join(bad) if bad else "every TEST_CASE name is safe for catch_discover_tests")
sys.exit(1 if bad else 0)
