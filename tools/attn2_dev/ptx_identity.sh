#!/usr/bin/env bash
# Compare the PTX of two dumps of tools/attn2_dev/compile_cpu.py, file by file (same relative path),
# after stripping what only encodes source positions: `.loc` / `.file` directives and any DWARF
# `.section .debug_*` block (the default compile emits none of them: two compiles of one source are
# byte-identical, no hash or path varies; the strip only keeps a -lineinfo dump comparable).
# Prints IDENTICAL <variant dir> per pair, else the first differences; exits 1 if any pair differs
# or a file is missing on a side. The kernel's symbol name embeds the module name, so a copy of
# attn2.py loaded under another name (launch's _kernel) only compares with a copy of the same name.
#
#   tools/attn2_dev/ptx_identity.sh BEFORE_DIR AFTER_DIR
#
# Note: compile_cpu.py passes --dump-dir=DIR/q<q>w<w><layout>, a folder the DSL does not create
# (no PTX is written if it is missing); create them first, e.g.
#   for v in q8w0deep q8w0wide q1w0deep q1w0wide q8w2048deep q8w2048wide q1w2048deep q1w2048wide; do
#       mkdir -p DIR/$v; done
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
