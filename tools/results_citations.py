"""Check the raw-file citations of bench/RESULTS.md and bench/RESULTS-archive.md: every file a
results file names under bench/runs/ must be in the tree, or in git history at the commit the text
names for it, and every file in bench/runs/ must be cited.

    python tools/results_citations.py [bench/RESULTS.md bench/RESULTS-archive.md]

A citation is a code span naming bench/runs/NAME, or NAME's short form `-sNN-REST` (the run's
ordinal and the rest of the name; a date is never needed), or a continuation `-REST` of the
citation before it in the same paragraph (`-s30-qkv-mma-lag-ab1.txt`, `-ab2.txt`); `*` and
`{a,b}` and `ab1..ab7` expand. A citation that matches nothing in the tree must be followed, in its paragraph, by
"(in git history at HASH)" (a commit that holds every file it names), or its file must say once,
near its top, that the files it cites "no longer in the tree" are "in git history at commit HASH".
Exits 1 on any citation that resolves nowhere or any bench/runs/ file that no results file cites.
"""
import fnmatch
import os
import re
import subprocess
import sys

RUNS = "bench/runs/"
SPAN = re.compile(r"`([^`\n]+)`")
HISTORY = re.compile(r"in\s+git\s+history\s+at\s+([0-9a-f]{7,40})\b")
FILE_WIDE = re.compile(r"no\s+longer\s+in\s+the\s+tree\s+(?:is|are)\s+in\s+git\s+history\s+at\s+commit\s+([0-9a-f]{7,40})\b")
NAME = re.compile(r"^[A-Za-z0-9_.*{},-]+$")   # what a citation may hold


def braces(pattern: str) -> list[str]:
    """{a,b} alternatives, and a range `ab1..ab7` (each number, any tail)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m:
        return [p for alt in m.group(1).split(",") for p in braces(pattern[:m.start()] + alt + pattern[m.end():])]
    r = re.match(r"^(.*?)([A-Za-z_]*)(\d+)\.\.\2(\d+)$", pattern)
    if r:
        return [f"{r.group(1)}{r.group(2)}{i}*" for i in range(int(r.group(3)), int(r.group(4)) + 1)]
    return [pattern]


def tree_files() -> list[str]:
    return sorted(f for f in os.listdir(RUNS) if os.path.isfile(os.path.join(RUNS, f)))


_commits: dict = {}


def commit_files(commit: str) -> list[str]:
    if commit not in _commits:
        out = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, RUNS], capture_output=True,
                             text=True)
        _commits[commit] = sorted(p[len(RUNS):] for p in out.stdout.split()) if out.returncode == 0 else None
    return _commits[commit]


def matches(pattern: str, names: list[str]) -> list[str]:
    """Files of names that the citation pattern (a full name, or -sNN-REST) names."""
    out = []
    for p in braces(pattern):
        glob = p if not p.startswith("-") else "*" + p
        out += [n for n in names if fnmatch.fnmatchcase(n, glob)]
    return sorted(set(out))


def continuation(prev: str, cont: str, names: list[str]) -> str | None:
    """prev with its tail replaced by cont (`-ab1.txt` then `-ab2.txt`), the first cut that names a file."""
    for i in range(len(prev) - 1, 0, -1):
        if prev[i] in "-_.":
            for c in (cont, "_" + cont[1:] if cont.startswith("-") else cont):
                for cand in (prev[:i] + c, prev[:i] + c + "*"):   # `-ab1` for `-ab1.txt`
                    if matches(cand, names):
                        return cand
    return None


def check(path: str, everything: list[str]) -> tuple[int, set]:
    """(failures, files of the tree cited) of one results file; prints one line per citation."""
    text = open(path).read()
    wide = FILE_WIDE.search(text[:4000])
    wide_commit = wide.group(1) if wide else None
    fails, cited = 0, set()
    for para in re.split(r"\n\s*\n", text):
        prev = None
        for m in SPAN.finditer(para):
            raw = m.group(1).strip()
            if raw.startswith(RUNS):
                pat = raw[len(RUNS):]
            elif re.match(r"^-s\d+-", raw) or (prev and raw.startswith(("-", ".")) and NAME.match(raw)):
                pat = raw
            else:
                continue
            if not NAME.match(pat) or pat == "":
                continue
            if not re.match(r"^(\d{4}-\d\d-\d\d-|-s\d+-)", pat):       # a continuation
                pat = continuation(prev, pat, everything) if prev else None
                if pat is None:
                    print(f"{path}: UNRESOLVED continuation `{raw}` after `{prev}`")
                    fails += 1
                    continue
            prev = pat
            here = matches(pat, tree_files())
            cited.update(here)
            if here:
                print(f"{path}: in tree      `{raw}` -> {', '.join(here)}")
                continue
            after = HISTORY.search(para, m.end())
            commit = after.group(1) if after else wide_commit
            there = matches(pat, commit_files(commit) or []) if commit else []
            if there:
                print(f"{path}: in history   `{raw}` -> {commit}: {', '.join(there)}")
            else:
                print(f"{path}: MISSING      `{raw}` (neither in the tree nor at {commit or 'a named commit'})")
                fails += 1
    return fails, cited


def main(argv: list[str]) -> int:
    paths = argv or ["bench/RESULTS.md", "bench/RESULTS-archive.md"]
    everything = sorted(set(tree_files()) | set(commit_files("HEAD") or []))
    fails, cited = 0, set()
    for path in paths:
        f, c = check(path, everything)
        fails += f
        cited |= c
    uncited = [n for n in tree_files() if n not in cited]
    for n in uncited:
        print(f"NOT CITED    {RUNS}{n}")
    print(f"{fails} citations resolve nowhere; {len(uncited)} of {len(tree_files())} files in {RUNS} not cited")
    return 1 if fails or uncited else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
