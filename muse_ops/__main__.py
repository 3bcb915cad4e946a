"""python -m muse_ops demo [...] | bench [...]"""
from __future__ import annotations

import os
import sys

USAGE = """usage: python -m muse_ops {demo,bench} [options]
  demo    a few speculative-verify steps of a TP8-sized layer, checked against float64
  bench   the side-by-side benchmark table (run from the source checkout: it lives in bench/)"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from .demo import main as demo_main
        return demo_main(rest)
    if cmd == "bench":
        sys.path.insert(0, os.getcwd())  # bench/ is part of the checkout, not of the installed package
        try:
            from bench.run import main as bench_main
        except ImportError as exc:
            print(f"muse_ops bench: cannot import bench.run ({exc}); run it from the muse_ops checkout",
                  file=sys.stderr)
            return 2
        return bench_main(rest)
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
