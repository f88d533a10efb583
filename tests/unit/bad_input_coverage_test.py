#!/usr/bin/env python3
"""The bad-input tests cover the whole API: every nccl* function the library exports is called
in one of the bad-input test files (a new public function without such a call fails here).

The functions come from the library's dynamic symbol table (nm -D --defined-only), not from a
header. A call is the function's name followed by "(" in the C code once comments, string and
character literals are blanked out, and not preceded by a type (which would make it a
declaration or a definition): a name in a comment, in a message or in a prototype does not count.

Usage: bad_input_coverage_test.py [--nm NM] LIBNCCL TEST_FILE...
"""
import argparse
import re
import subprocess
import sys

# Fewer exported functions than this means the symbol table was not read right.
MIN_FUNCTIONS = 40
# Symbol types of functions in nm's output: text, weak, indirect.
FUNCTION_TYPES = set("TtWwi")
# Words that may stand right before a call.
CALL_KEYWORDS = {"return", "else", "case", "do", "sizeof"}
WORD_AT_END = re.compile(r"[A-Za-z0-9_]+$")


def exported_functions(nm, lib):
    """The nccl* functions `lib` defines in its dynamic symbol table."""
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True, capture_output=True,
                         text=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[1] not in FUNCTION_TYPES:
            continue
        name = fields[2].split("@")[0]
        if name.startswith("nccl"):
            names.add(name)
    return sorted(names)


def strip_c(text):
    """`text` with comments and string and character literals replaced by spaces (newlines
    kept), so that only code is left to search."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
        i = j
    return "".join(out)


def is_call(code, start):
    """Whether the name at code[start] (followed by "(") is a call rather than a declaration:
    the token before it is no type name."""
    before = code[:start].rstrip()
    if not before:
        return False
    if before[-1] == "*":
        # "const char* f(" declares a function returning a pointer; "(*f)(" or "= *f(" call.
        before = before[:-1].rstrip()
    # A preprocessor line before the name ends there ("#pragma ... ignored" then "f();").
    line_start = before.rfind("\n") + 1
    if before[line_start:].lstrip().startswith("#") and "\n" in code[len(before):start]:
        return True
    word = WORD_AT_END.search(before)
    return word is None or word.group(0) in CALL_KEYWORDS


def calls_in(code, name):
    """Line numbers of the calls of `name` in stripped `code`."""
    lines = []
    for m in re.finditer(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\s*\(", code):
        if is_call(code, m.start()):
            lines.append(code.count("\n", 0, m.start()) + 1)
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--verbose", action="store_true", help="print where each function is called")
    ap.add_argument("lib")
    ap.add_argument("sources", nargs="+")
    args = ap.parse_args()

    functions = exported_functions(args.nm, args.lib)
    codes = {}
    for path in args.sources:
        with open(path, encoding="utf-8") as f:
            codes[path] = strip_c(f.read())
    missing = []
    for name in functions:
        where = [(path, lines) for path, code in codes.items() for lines in [calls_in(code, name)]
                 if lines]
        if not where:
            missing.append(name)
        elif args.verbose:
            print("%s: %s" % (name, ", ".join("%s:%d" % (p, l[0]) for p, l in where)))
    fail = False
    for name in missing:
        print("FAIL: no call of %s in the bad-input tests (comments, strings and declarations do "
              "not count): %s" % (name, " ".join(args.sources)))
        fail = True
    if len(functions) <= MIN_FUNCTIONS:
        print("FAIL: only %d nccl* functions exported by %s" % (len(functions), args.lib))
        fail = True
    if not fail:
        print("bad-input calls cover all %d exported nccl* functions" % len(functions))
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
