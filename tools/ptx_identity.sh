#!/usr/bin/env bash
# Compare the PTX of two dumps of tools/ptx_dump.py (one folder per variant, named by its config),
# file by file, after stripping what only encodes source positions: `.loc` / `.file` directives and
# any DWARF `.section .debug_*` block (two compiles of one source are byte-identical without them).
# Prints IDENTICAL <variant dir> per pair, else the first differences; exits 1 if any pair differs
# or a variant is missing on a side.
#
#   python tools/ptx_dump.py BEFORE_DIR; (change the code); python tools/ptx_dump.py AFTER_DIR
#   tools/ptx_identity.sh BEFORE_DIR AFTER_DIR
set -u
if [ $# -ne 2 ]; then echo "usage: $0 BEFORE_DIR AFTER_DIR" >&2; exit 2; fi
a=$1 b=$2
strip() {
    # drop .loc/.file lines and DWARF sections (a .section .debug_* { ... } block)
    awk '
        /^[ \t]*\.section[ \t]+\.debug/ { skip = 1 }
        skip { if ($0 ~ /^[ \t]*}/) skip = 0; next }
        /^[ \t]*\.(loc|file)[ \t]/ { next }
        { print }
    ' "$1"
}
status=0 n=0
while IFS= read -r rel; do
    n=$((n + 1))
    if [ ! -f "$b/$rel" ]; then echo "MISSING in $b: $rel"; status=1; continue; fi
    if diff -q <(strip "$a/$rel") <(strip "$b/$rel") >/dev/null; then
        echo "IDENTICAL $(dirname "$rel")"
    else
        echo "DIFFERENT $rel"
        diff <(strip "$a/$rel") <(strip "$b/$rel") | head -40
        status=1
    fi
done < <(cd "$a" && find . -name '*.ptx' | sed 's|^\./||' | sort)
while IFS= read -r rel; do
    if [ ! -f "$a/$rel" ]; then echo "MISSING in $a: $rel"; status=1; fi
done < <(cd "$b" && find . -name '*.ptx' | sed 's|^\./||' | sort)
if [ "$n" -eq 0 ]; then echo "no .ptx files under $a"; exit 2; fi
[ $status -eq 0 ] && echo "ALL IDENTICAL ($n files)"
exit $status
