"""python -m muse_ops {demo,bench,build-shims} [options]"""
from __future__ import annotations

import sys
from pathlib import Path

USAGE = """usage: python -m muse_ops {demo,bench,build-shims} [options]
  demo         a few speculative-verify steps of a TP8-sized layer, checked against float64
  bench        the side-by-side benchmark table (needs the source checkout: bench/ is not installed)
  build-shims  compile the C++ ops (csrc_shims/) against the installed torch, into the package
'python -m muse_ops demo --help' and 'python -m muse_ops bench --help' list the options."""


def _checkout_root() -> Path | None:
    """The source checkout that holds bench/ beside the package (an editable or in-place install),
    whatever the working directory."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "bench" / "run.py").is_file() else None


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "demo":
            from .demo import main as demo_main
            return demo_main(rest)
        if cmd == "build-shims":
            from .cutedsl.shims import main as shims_main
            return shims_main(["build-shims", *rest])
        if cmd == "bench":
            root = _checkout_root()
            if root is None:
                print("muse_ops bench: bench/ is part of the source checkout, not of the installed package; "
                      "install the checkout (pip install -e .) and run it from any directory", file=sys.stderr)
                return 2
            sys.path.insert(0, str(root))
            from bench.run import main as bench_main
            return bench_main(rest)
    except (RuntimeError, ValueError) as exc:   # a backend that cannot run, bad input: one line, no traceback
        print(f"muse_ops {cmd}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"muse_ops: unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
