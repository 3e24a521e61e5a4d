"""Container images of a Python fiber program, for the docker and
kubernetes backends: ``python -m fiber.image build [--tag NAME[:TAG]]
[SCRIPT]``, or ``fiber.image.build()`` from code.

The image is FROM scratch, as the C programs' images are, and needs no
registry: it holds this interpreter (and the shared libraries it loads),
its standard library, every directory on sys.path (the virtual
environment's site-packages, the fiber package, the program's folder),
the virtual environment's pyvenv.cfg, and the libraries their extension
modules need, each at the same path as here.  A job then runs the same
``<interpreter> -m fiber._bootstrap`` in a container as it would locally.
Left out: the standard library's test suite and the base interpreter's
own site-packages when the virtual environment does not use them.
"""
import hashlib
import os
import sys
import sysconfig

from . import _fiber


def _trees(script):
    trees, seen = [], set()

    def add(path):
        path = os.path.abspath(path)
        if path not in seen and os.path.exists(path):
            seen.add(path)
            trees.append(path)

    for p in sys.path:
        add(p or os.getcwd())
    add(sysconfig.get_paths()["stdlib"])
    add(sysconfig.get_paths()["platstdlib"])
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    add(cfg)
    if script:
        add(os.path.dirname(os.path.abspath(script)))
    return trees


def _excludes():
    stdlib = sysconfig.get_paths()["stdlib"]
    out = [os.path.join(stdlib, "test"), os.path.join(stdlib, "idlelib")]
    base_site = os.path.join(stdlib, "site-packages")
    if base_site not in [os.path.abspath(p) for p in sys.path if p]:
        out.append(base_site)
    return [os.path.realpath(p) for p in out]


def default_tag(script=None):
    """fiber/python-<program name>:<12 hex digits of a hash of what the
    image holds: interpreter, trees and fiber's version>."""
    h = hashlib.sha256()
    for t in [sys.executable] + _trees(script):
        h.update(t.encode() + b"\0")
    h.update(_fiber.VERSION.encode())
    name = os.path.splitext(os.path.basename(script or "program"))[0]
    name = "".join(c if c.isalnum() else "-" for c in name.lower()) or "program"
    return "fiber/python-%s:%s" % (name, h.hexdigest()[:12])


def build(script=None, tag=None, progress=False):
    """Builds and imports the image; returns (image id, tag).  With
    progress, a line per stage of the build goes to stderr."""
    tag = tag or default_tag(script)
    image_id = _fiber.image_build(os.path.abspath(sys.executable),
                                  _trees(script), _excludes(), tag,
                                  bool(progress))
    return image_id, tag


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m fiber.image",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build an image of this Python "
                       "environment and a program")
    b.add_argument("script", nargs="?", help="the program (its folder is "
                   "added)")
    b.add_argument("-t", "--tag", help="NAME[:TAG] (default fiber/python-"
                   "<program>:<hash>)")
    args = ap.parse_args(argv)
    # Run as `python -m fiber.image`, sys.path[0] is the current directory
    # (-m puts it there), not a folder the program uses: the program's own
    # folder is added from SCRIPT.  Leaving it would copy whatever the
    # user stands in (a home directory, a repository) into the image.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    try:
        image_id, tag = build(args.script, args.tag, progress=True)
    except _fiber.FiberError as e:
        print("fiber image build: %s" % e, file=sys.stderr)
        return 1
    print("%s %s" % (image_id, tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
