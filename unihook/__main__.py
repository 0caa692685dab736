"""The `unihook` command (also `python -m unihook`): `--version`, `demo [--out DIR]`."""

from __future__ import annotations

import argparse
import sys
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # the only command; argparse has already rejected anything else
    from .demo import main as demo

    return demo(args.out)


if __name__ == "__main__":
    sys.exit(main())
