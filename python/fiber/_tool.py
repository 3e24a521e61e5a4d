"""The `fiber` console script of a pip-installed package: runs the C
`fiber` command (fiber ps, logs, kill, clean, top, run, image) built with
the package as fiber/_bin/fiber, with the same arguments.  One exception:
`fiber image build SCRIPT.py` runs this interpreter's fiber.image (the
interpreter decides what goes into a Python program's image), as the C
command would run python3's from PATH."""
import os
import sys


def path():
    """Where the package's `fiber` command is."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin",
                        "fiber")


def main():
    args = sys.argv[1:]
    if args[:2] == ["image", "build"] and any(
            a.endswith(".py") for a in args[2:]):
        from . import image
        sys.exit(image.main(args[1:]))
    tool = path()
    if not os.access(tool, os.X_OK):
        sys.exit("fiber: the fiber command was not built with this package "
                 "(%s is missing); reinstall it with pip install" % tool)
    os.execv(tool, [tool] + args)


if __name__ == "__main__":
    main()
