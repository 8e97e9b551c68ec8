#!/usr/bin/env python3
"""check_doc_refs.py REPO: every document a comment of the code, the tests,
the benchmarks or the scripts names exists, and so does every section it
names in it.

A document is a path ending in .md (docs/design.md, bench/RESULTS.md,
README.md, ...), taken from the repository's root, or from the commenting
file's folder when it starts with ./ or ../ (../shared/ is outside the
repository and not checked).  A section is a quoted name right after the
path: `docs/design.md, "Pipelining", "Scheduler" and "server/ layout"` or
`(docs/design.md, "server/ layout")`; it must be one of that document's
headings (`#`, `##`, ...), compared without a leading number ("13. "),
or the part of one before its colon ("Scheduler" for "Scheduler: fair
shares between connections").

    check_doc_refs.py --files REPO FILE...   checks those files only (the
                                             script's own test).

Prints each stale reference as FILE:LINE: what, and exits 1 if there is
one.  docs/design.md's "Contents" must list its `##` sections, in order.
"""
import os
import re
import sys

SOURCE_DIRS = ("core", "cache", "proto", "server", "tests", "bench", "scripts", "deploy", "cmake")
SOURCE_EXT = (".c", ".h", ".cmake", ".sh", ".py", ".txt", ".yml", ".cfg")
SOURCE_NAMES = ("CMakeLists.txt", "Dockerfile", "run", "compare", "cgcount", "interleave")

PATH_RE = re.compile(r"(?<![\w/.-])((?:\.\.?/)?(?:[\w.-]+/)*[\w.-]+\.md)\b")
QUOTED_RE = re.compile(r'\s*(?:,|:|\(|and|or|section|sections)?\s*"([^"\n]{2,80})"')
HEADING_RE = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
NUMBER_RE = re.compile(r"^(?:\d+\.)+\s*")


def headings(path, cache={}):
    if path not in cache:
        found = set()
        in_code = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("```"):
                    in_code = not in_code
                    continue
                m = None if in_code else HEADING_RE.match(line)
                if m:
                    text = NUMBER_RE.sub("", m.group(1).strip())
                    found.add(text)
                    if ": " in text:  # "Scheduler: fair shares ..." is "Scheduler"
                        found.add(text.split(": ", 1)[0])
        cache[path] = found
    return cache[path]


def comment_text(line):
    """The part of a source line that is comment, or the whole line for
    the scripts whose comments we cannot tell from strings cheaply."""
    s = line.strip()
    for lead in ("/*", "*", "//", "#"):
        if s.startswith(lead):
            return s[len(lead):].lstrip("*/ ")
    i = line.find("/*")
    if i >= 0:
        return line[i + 2:]
    i = line.find("//")
    if i >= 0:
        return line[i + 2:]
    i = line.find(" # ")
    if i >= 0:
        return line[i + 3:]
    return None


def check_file(repo, path, out):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (UnicodeDecodeError, OSError):
        return
    rel = os.path.relpath(path, repo)
    texts = [comment_text(l) for l in lines]
    for n, text in enumerate(texts):
        if not text:
            continue
        for m in PATH_RE.finditer(text):
            ref = m.group(1)
            if ref.startswith("../shared/") or "/shared/" in ref:
                continue
            base = os.path.dirname(path) if ref.startswith(".") else repo
            doc = os.path.normpath(os.path.join(base, ref))
            if not os.path.isfile(doc):
                out.append("%s:%d: no document %s" % (rel, n + 1, ref))
                continue
            # The quoted names after the path, on this comment line and the
            # next (a list may wrap).
            rest = text[m.end():]
            if n + 1 < len(texts) and texts[n + 1]:
                rest += " " + texts[n + 1]
            pos = 0
            while True:
                q = QUOTED_RE.match(rest, pos)
                if not q:
                    break
                name = q.group(1)
                if name not in headings(doc):
                    out.append('%s:%d: %s has no section "%s"' % (rel, n + 1, ref, name))
                pos = q.end()


def check_contents(repo, doc, out):
    """A document with a "## Contents" list names each of its other `##`
    sections in it, in order."""
    path = os.path.join(repo, doc)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if "\n## Contents\n" not in text:
        return
    heads = [h for h in re.findall(r"^## (.+?)\s*$", text, flags=re.M) if h != "Contents"]
    toc = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[(.+?)\]\(#", toc, flags=re.M)
    if listed != heads:
        missing = [h for h in heads if h not in listed]
        extra = [h for h in listed if h not in heads]
        out.append("%s: Contents does not list its sections in order (missing %s, stale %s)"
                   % (doc, missing, extra))


def source_files(repo):
    for d in SOURCE_DIRS:
        for root, dirs, files in os.walk(os.path.join(repo, d)):
            dirs[:] = [x for x in dirs if x not in ("corpus", "regressions", "ref", "docrefs")]
            for name in files:
                if name.endswith(SOURCE_EXT) or name in SOURCE_NAMES:
                    yield os.path.join(root, name)
    for name in ("CMakeLists.txt", "Dockerfile"):
        p = os.path.join(repo, name)
        if os.path.isfile(p):
            yield p


def main(argv):
    if len(argv) >= 3 and argv[1] == "--files":
        repo, files = argv[2], argv[3:]
    elif len(argv) == 2:
        repo, files = argv[1], None
    else:
        sys.stderr.write(__doc__)
        return 2
    repo = os.path.abspath(repo)
    out = []
    for path in files if files is not None else sorted(source_files(repo)):
        check_file(repo, os.path.abspath(path), out)
    if files is None:
        check_contents(repo, "docs/design.md", out)
    for line in out:
        print(line)
    if out:
        return 1
    print("every document and section named in a comment exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
