#!/usr/bin/env python3
"""Builds megatron-cpp's default corpus: real text from Debian packages as JSONL.

    python3 scripts/make_corpus.py [--out data/corpus/corpus.jsonl]

One JSON object per line, {"text": "..."}, written by Python's json module
(so every control character, quote and backslash is escaped correctly; other
characters stay UTF-8). Documents, in this order:

  1. every record of the `fortunes` package (/usr/share/games/fortunes/*,
     records separated by lines holding only `%`), files in name order;
  2. every licence text in /usr/share/common-licenses, in name order (one
     document per file; symbolic links skipped);
  3. the manual pages of a fixed list of packages (MAN_PACKAGES), in every
     language those packages ship, rendered to plain UTF-8 text by man-db
     (`man -l`, 80 columns, no hyphenation, no justification), ordered by
     path; pages that only redirect (`.so`) and symbolic links are skipped.

The output depends only on the installed versions of those packages, not on
what else is installed. A manifest (<out>.manifest: counts, bytes, sha256) is
written next to the corpus so two machines can compare. The corpus is never
committed (data/ is git-ignored).
"""

import argparse
import concurrent.futures
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys

FORTUNE_DIR = "/usr/share/games/fortunes"
LICENSE_DIR = "/usr/share/common-licenses"
# Packages whose manual pages are rendered; scripts/setup.sh installs them.
# manpages and manpages-dev (the Linux man-pages project) hold most of the prose.
MAN_PACKAGES = [
    "manpages", "manpages-dev", "coreutils", "bash", "util-linux", "findutils", "grep", "sed",
    "tar", "gzip", "make", "man-db", "groff-base", "dpkg", "apt", "openmpi-bin",
]
MIN_BYTES = 10 * 1000 * 1000
# A page renders in well under a second; groff 1.22.4 loops forever on a few
# (Debian 12: apt's Japanese apt_preferences(5)), which are left out.
RENDER_TIMEOUT_S = 30


def fortune_records(path):
    """Splits a fortune file into records (lines holding only '%' separate them)."""
    with open(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8", errors="strict")
    records, cur = [], []
    for line in text.split("\n"):
        if line == "%":
            records.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    records.append("\n".join(cur))
    # A record is the text between separators, with its trailing newline.
    return [r + "\n" for r in records if r.strip()]


def man_pages():
    """Paths of the real (non-redirect) manual pages owned by MAN_PACKAGES, sorted."""
    pages = set()
    for pkg in MAN_PACKAGES:
        out = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"make_corpus: package {pkg} is not installed; its manual pages are left out "
                  "(run scripts/setup.sh)", file=sys.stderr)
            continue
        for p in out.stdout.splitlines():
            if not p.startswith("/usr/share/man/") or not p.endswith(".gz"):
                continue
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with gzip.open(p, "rb") as f:
                head = f.read(256)
            if head.lstrip().startswith(b".so "):
                continue
            pages.add(p)
    return sorted(pages)


def render(path):
    env = dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8", MANWIDTH="80", MANPAGER="cat",
               PAGER="cat")
    env.pop("MAN_KEEP_FORMATTING", None)
    # Own process group, so a timeout also ends man's troff/grotty children.
    proc = subprocess.Popen(["man", "--nh", "--nj", "-E", "UTF-8", "-l", path], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=RENDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return path, None
    if proc.returncode != 0 or not stdout.strip():
        return path, None
    return path, stdout.decode("utf-8", errors="strict")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="data/corpus/corpus.jsonl")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    docs = []  # (source, text)
    if not os.path.isdir(FORTUNE_DIR):
        sys.exit(f"make_corpus: {FORTUNE_DIR} is missing; install the Debian package 'fortunes'")
    for name in sorted(os.listdir(FORTUNE_DIR)):
        p = os.path.join(FORTUNE_DIR, name)
        if name.endswith(".dat") or os.path.islink(p) or not os.path.isfile(p):
            continue
        for r in fortune_records(p):
            docs.append(("fortunes", r))
    for name in sorted(os.listdir(LICENSE_DIR)):
        p = os.path.join(LICENSE_DIR, name)
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        with open(p, "rb") as f:
            docs.append(("licenses", f.read().decode("utf-8", errors="strict")))

    pages = man_pages()
    rendered = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        for path, text in ex.map(render, pages):
            rendered[path] = text
    failed = [p for p in pages if rendered[p] is None]
    for p in pages:
        if rendered[p] is not None:
            docs.append(("man", rendered[p]))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = f"{args.out}.tmp.{os.getpid()}"
    counts = {}
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for src, text in docs:
            f.write(json.dumps({"text": text}, ensure_ascii=False))
            f.write("\n")
            counts[src] = counts.get(src, 0) + 1
    size = os.path.getsize(tmp)
    if size < MIN_BYTES:
        os.unlink(tmp)
        sys.exit(f"make_corpus: only {size} bytes of text (need {MIN_BYTES}); are the packages "
                 f"fortunes, {', '.join(MAN_PACKAGES)} installed?")
    os.replace(tmp, args.out)
    h = hashlib.sha256()
    with open(args.out, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    manifest = {
        "documents": len(docs), "bytes": size, "sha256": h.hexdigest(), "sources": counts,
        "man_pages_failed": failed,
    }
    with open(args.out + ".manifest", "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"make_corpus: wrote {args.out}: {len(docs)} documents, {size / 1e6:.1f} MB "
          f"({', '.join(f'{k} {v}' for k, v in counts.items())}; {len(failed)} pages failed to render)")


if __name__ == "__main__":
    main()
