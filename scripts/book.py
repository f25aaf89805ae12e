#!/usr/bin/env python3
"""Stages walpost's book and checks the rendered pages' links.

The book's pages live where readers of the repository find them: docs/ (the chapters),
the README (the introduction), ARCHITECTURE.md and runbooks/. Their links are written
for the repository (GitHub renders them). `stage` copies them into one mdBook source
folder (target/book-src/src) and rewrites each relative link for the page's place in
the book; a link to a file that is not in the book (source code, scripts) keeps its text
and loses the link. `check` reads the HTML mdBook wrote and fails on any relative link
to a page or an anchor that does not exist.

    python3 scripts/book.py stage   # then: mdbook build target/book-src
    python3 scripts/book.py check   # target/book
"""

import html.parser
import os
import posixpath
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE = os.path.join(ROOT, "target", "book-src")
OUT = os.path.join(ROOT, "target", "book")

LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")


def book_path(repo_path):
    """Where a repository file is in the book, or None when it is not in it."""
    if repo_path == "README.md":
        return "index.md"
    if repo_path == "ARCHITECTURE.md":
        return "ARCHITECTURE.md"
    if repo_path in ("docs/SUMMARY.md", "docs/book.toml"):
        # The table of contents is the book's sidebar, not a page.
        return None
    if repo_path.startswith("docs/"):
        placed = repo_path[len("docs/"):]
        # mdBook renders a folder's README.md as its index.html.
        if posixpath.basename(placed) == "README.md":
            placed = posixpath.join(posixpath.dirname(placed), "index.md")
        return placed
    if repo_path.startswith("runbooks/") and repo_path.endswith(".md"):
        return repo_path
    return None


def is_fence(line):
    """A fenced code block's opening or closing line (not a paragraph that starts with
    an inline code span of backticks: an info string holds none)."""
    stripped = line.lstrip()
    ticks = len(stripped) - len(stripped.lstrip("`"))
    return ticks >= 3 and "`" not in stripped[ticks:]


def rewrite(text, repo_path, dest):
    """The page's links, rewritten from the repository's coordinates to the book's."""
    out = []
    fenced = False
    for line in text.split("\n"):
        if is_fence(line):
            fenced = not fenced
        if fenced or "](" not in line:
            out.append(line)
            continue

        def fix(m):
            bang, label, target = m.group(1), m.group(2), m.group(3)
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                return m.group(0)
            path, _, fragment = target.partition("#")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
            placed = book_path(resolved)
            if placed is None:
                return label if not bang else m.group(0)
            rel = posixpath.relpath(placed, posixpath.dirname(dest) or ".")
            return f"{bang}[{label}]({rel}{'#' + fragment if fragment else ''})"

        out.append(LINK.sub(fix, line))
    return "\n".join(out)


def stage():
    src = os.path.join(STAGE, "src")
    shutil.rmtree(STAGE, ignore_errors=True)
    os.makedirs(src)
    pages = ["README.md", "ARCHITECTURE.md"]
    pages += ["runbooks/" + f for f in sorted(os.listdir(os.path.join(ROOT, "runbooks"))) if f.endswith(".md")]
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        for f in files:
            pages.append(os.path.relpath(os.path.join(folder, f), ROOT))
    for repo_path in pages:
        if repo_path == "docs/book.toml":
            continue
        dest = book_path(repo_path) if repo_path != "docs/SUMMARY.md" else "SUMMARY.md"
        target = os.path.join(src, dest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if repo_path == "docs/SUMMARY.md":
            # Already in the book's coordinates; only the introduction's name differs.
            text = open(os.path.join(ROOT, repo_path), encoding="utf-8").read()
            text = re.sub(r"\((?:([^()\s]*)/)?README\.md\)", lambda m: f"({m.group(1) + '/' if m.group(1) else ''}index.md)", text)
            open(target, "w", encoding="utf-8").write(text)
        elif repo_path.endswith(".md"):
            text = open(os.path.join(ROOT, repo_path), encoding="utf-8").read()
            open(target, "w", encoding="utf-8").write(rewrite(text, repo_path, dest))
        else:
            shutil.copyfile(os.path.join(ROOT, repo_path), target)
    shutil.copyfile(os.path.join(ROOT, "docs", "book.toml"), os.path.join(STAGE, "book.toml"))
    print(f"book: {len(pages)} files staged in {os.path.relpath(STAGE, ROOT)}")


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key):
                self.links.append(a[key])


def check():
    pages = {}
    for folder, _, files in os.walk(OUT):
        for f in files:
            if f.endswith(".html"):
                path = os.path.join(folder, f)
                parser = Links()
                parser.feed(open(path, encoding="utf-8").read())
                pages[os.path.relpath(path, OUT)] = parser
    if not pages:
        sys.exit(f"book: no pages in {OUT}: build it first")
    broken = []
    checked = 0
    for page, parser in sorted(pages.items()):
        # print.html repeats every chapter with its links rewritten to anchors of itself.
        if page == "print.html":
            continue
        for link in parser.links:
            if re.match(r"[a-z]+:", link) or link.startswith("//"):
                continue
            checked += 1
            path, _, fragment = link.partition("#")
            target = posixpath.normpath(posixpath.join(posixpath.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(OUT, target)):
                broken.append(f"{page}: {link} (no such file)")
            elif fragment and target.endswith(".html") and fragment not in pages[target].ids:
                broken.append(f"{page}: {link} (no such anchor)")
    if broken:
        sys.exit(f"book: {len(broken)} broken links:\n" + "\n".join(broken))
    print(f"book: {len(pages)} pages, {checked} links, none broken")


if __name__ == "__main__":
    {"stage": stage, "check": check}[sys.argv[1] if len(sys.argv) > 1 else "stage"]()
