"""Builds fiber._fiber, the C extension over libfiber.

libfiber is linked in statically, so the installed package needs nothing
from the build tree: `pip install ./python` compiles libfiber's own sources
(../src, ../include) into the extension, and builds the `fiber` command
(../src/tool) as the package's fiber/_bin/fiber, which the `fiber` console
script of the environment runs (fiber/_tool.py).  `make python` builds libfiber
with CMake first and passes the static library in FIBER_STATIC_LIB, which
then replaces those sources.  The Debian packages the library links
(libsodium, libinih, libjansson; libcurl's headers) come from `make deps`.
"""
import glob
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKAGES = ["libsodium", "inih", "jansson", "libcurl"]


def pkg_config(flag):
    try:
        out = subprocess.check_output(["pkg-config", flag] + PACKAGES, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit("fiber: pkg-config could not find %s (%s); run `make deps` "
                 "in the fiber repository first" % (", ".join(PACKAGES), e))
    return out.split()


def library_sources():
    """libfiber's sources: every .c under src/ but the `fiber` command's."""
    found = glob.glob(os.path.join(ROOT, "src", "**", "*.c"), recursive=True)
    return sorted(p for p in found if os.sep + "tool" + os.sep not in p)


static = os.environ.get("FIBER_STATIC_LIB")
sources = sorted(glob.glob(os.path.join(HERE, "src", "*.c")))
extra_objects = []
if static:
    extra_objects.append(os.path.abspath(static))
else:
    sources += library_sources()

# setuptools wants sources relative to this directory.
sources = [os.path.relpath(p, HERE) for p in sources]

cflags = pkg_config("--cflags")
libs = pkg_config("--libs")
ext = Extension(
    "fiber._fiber",
    sources=sources,
    include_dirs=[os.path.join(ROOT, "include"), os.path.join(ROOT, "src"),
                  os.path.join(HERE, "src")],
    define_macros=[("_GNU_SOURCE", "1")],
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wall",
                        "-Wextra", "-Wno-missing-field-initializers",
                        "-Wno-unused-parameter"] + cflags,
    extra_objects=extra_objects,
    depends=extra_objects + [os.path.relpath(p, HERE) for p in
                             glob.glob(os.path.join(HERE, "src", "*.h")) +
                             glob.glob(os.path.join(ROOT, "include", "fiber",
                                                    "*.h"))],
    # libcurl is dlopen()ed when first needed; only its headers are used.
    extra_link_args=[a for a in libs if "curl" not in a] + ["-lpthread", "-ldl"],
)



class build_ext_and_tool(build_ext):
    """build_ext, then the `fiber` command: src/tool/*.c linked with the
    same libfiber (its sources, or FIBER_STATIC_LIB) and libraries, put in
    the package as fiber/_bin/fiber."""

    def run(self):
        super().run()
        tool_sources = sorted(glob.glob(os.path.join(ROOT, "src", "tool",
                                                     "*.c")))
        lib = [] if static else library_sources()
        objects = self.compiler.compile(
            tool_sources + lib, output_dir=os.path.join(self.build_temp,
                                                        "tool"),
            include_dirs=ext.include_dirs, macros=ext.define_macros,
            extra_postargs=[a for a in ext.extra_compile_args
                            if a != "-fvisibility=hidden"])
        out_dir = os.path.join(self.build_lib if not self.inplace else HERE,
                               "fiber", "_bin")
        os.makedirs(out_dir, exist_ok=True)
        self.compiler.link_executable(
            objects + extra_objects, "fiber", output_dir=out_dir,
            extra_postargs=ext.extra_link_args)


setup(ext_modules=[ext], cmdclass={"build_ext": build_ext_and_tool})
