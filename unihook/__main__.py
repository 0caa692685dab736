"""The `unihook` command (also `python -m unihook`): `--version`, `demo [--out DIR]`."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence

from . import __version__

#: Where `unihook demo` writes its picture when no --out is given (relative to the cwd).
DEFAULT_DEMO_OUT = "unihook-demo"


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="unihook",
        description="One hook function for PyTorch and PaddlePaddle.",
    )
    cli.add_argument("--version", action="version", version=f"unihook {__version__}")
    commands = cli.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run the same hooks on the same model in every installed framework",
        description=(
            "Build a small model with identical weights in every installed framework, register "
            "the same hooks through unihook, print side by side what each saw, then the backend "
            "table; write a Grad-CAM picture (needs matplotlib) to DIR/gradcam.png."
        ),
    )
    demo.add_argument(
        "--out",
        metavar="DIR",
        default=DEFAULT_DEMO_OUT,
        help=f"directory for gradcam.png (default: ./{DEFAULT_DEMO_OUT})",
    )
    return cli


def out_dir_problem(out: str) -> str | None:
    """Why `out` cannot be the demo's output directory (None if it can), found leaving nothing
    behind: the demo makes the directory only when it has a picture to write."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        return "exists and is not a directory"
    existing = path
    while not os.path.exists(existing):  # the nearest existing ancestor: the demo makes the rest
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"cannot be created: {existing} is not a directory"
    try:  # os.access says yes to root on a read-only file system: try it
        os.rmdir(tempfile.mkdtemp(prefix=".unihook-probe-", dir=existing))
    except OSError as error:
        reason = error.strerror or type(error).__name__
        where = "cannot write into" if existing == path else "cannot be created in"
        return f"{where} {existing}: {reason}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    # the only command; argparse has already rejected anything else.
    # --out is checked before the demo runs (a minute of work), as argparse checks arguments:
    # one line on stderr, exit 2.
    problem = out_dir_problem(args.out)
    if problem is not None:
        cli.exit(2, f"{cli.prog} demo: error: --out {args.out}: {problem}\n")
    from .demo import main as demo

    return demo(args.out)


if __name__ == "__main__":
    sys.exit(main())
