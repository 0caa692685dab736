"""`python -m unihook demo`."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv[:1] != ["demo"]:
        print("usage: python -m unihook demo", file=sys.stderr)
        return 2
    from .demo import main as demo

    return demo()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
