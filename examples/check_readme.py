#!/usr/bin/env python3
"""Checks that every ```cpp and ```cmake block of the README is a file under
examples/, or a run of whole lines of one, so that every example a reader
copies is compiled and run by CI.

    check_readme.py README.md EXAMPLES_DIR
"""
import pathlib
import re
import sys


def lines(text):
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def contains(haystack, needle):
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def main():
    readme = pathlib.Path(sys.argv[1])
    examples = pathlib.Path(sys.argv[2])
    files = {p: lines(p.read_text()) for p in sorted(examples.rglob("*"))
             if p.is_file() and p.suffix in (".cpp", ".hpp", ".txt", ".cmake")}
    blocks = re.findall(r"^```(cpp|c\+\+|cmake)\n(.*?)^```", readme.read_text(), re.M | re.S)
    if not blocks:
        print(f"FAIL: no cpp or cmake blocks in {readme}")
        return 1
    failed = 0
    for lang, body in blocks:
        block = lines(body)
        where = [str(p.relative_to(examples.parent)) for p, text in files.items() if contains(text, block)]
        if where:
            print(f"ok: {lang} block '{block[0][:60]}' is in {', '.join(where)}")
        else:
            failed += 1
            print(f"FAIL: this {lang} block of {readme.name} is in no file under {examples}:")
            print("\n".join("    " + line for line in block))
    print(f"README blocks: {len(blocks) - failed} found in examples/, {failed} missing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
