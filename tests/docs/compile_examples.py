#!/usr/bin/env python3
"""compile_examples.py -- every C example of README.md and docs/ compiles.

ctest `docs.c_examples`.  Usage:

    compile_examples.py SOURCE_DIR LIBDIR CC [CFLAG...]

Finds each fenced block whose info string starts with `c` in SOURCE_DIR's
README.md and docs/**/*.md, compiles it against SOURCE_DIR/include with CC
(and CFLAGs: the sanitizer flags of the build, say) and, when it is a whole
program, links it against LIBDIR's libfiber.  A block that does not
compile fails the test; the compiler's messages name the Markdown file and
line (each block is compiled under `#line` directives).

The conventions a block follows (docs/architecture.md, "Examples in the
docs are compiled"):

  ```c              a translation unit.  Without an #include of its own it
                    is preceded by a prelude that includes <fiber/fiber.h>
                    and the usual C headers.  With a main() it is also
                    linked against libfiber.
  ```c fragment     statements: wrapped in a function body after the
                    prelude.
  In either kind, a line that is only a comment "/* in ...: */" (such as
  "/* in main(), after fiber_init(): */" or "/* in the master: */") splits
  the block: what stands before it is file scope (task definitions,
  types), what follows is statements, wrapped in a function body.
  ```c skip REASON  not compiled; counted and printed with its reason.

  A line that is only `...` (optionally followed by a comment) stands for
  code left out and is dropped.  Names a block uses without declaring them
  are declared in an HTML comment right above the fence, which Markdown
  does not show:

      <!-- c-setup
      static fiber_pool *pool;
      -->

  The setup is file-scope C, placed after the prelude; SOURCE_DIR is on
  the include path, so it may include an example's header
  ("examples/es/rollout.h") and the block then breaks when that changes.
"""

import concurrent.futures
import glob
import os
import re
import subprocess
import sys
import tempfile

PRELUDE = """\
#include <fiber/fiber.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
"""

# -Werror with the project's warnings, minus those a fragment cannot avoid
# (a variable declared for the example and never read, an array filled by
# code the example leaves out).
WARNINGS = ["-std=gnu11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
            "-Wno-unused-variable", "-Wno-unused-but-set-variable",
            "-Wno-unused-parameter", "-Wno-unused-function",
            "-Wno-unused-value", "-Wno-missing-field-initializers",
            "-Wno-maybe-uninitialized",
            "-Wno-unknown-warning-option"]

FENCE = re.compile(r"^(\s*)```c(?:\s+(.*))?\s*$")
CLOSE = re.compile(r"^\s*```\s*$")
ELIDED = re.compile(r"^\s*\.\.\.\s*(/\*.*\*/)?\s*$")
IN_MAIN = re.compile(r"^\s*/\*\s*in [^*]*:\s*\*/\s*$", re.I)
SETUP_OPEN = re.compile(r"^\s*<!--\s*c-setup\s*$")
SETUP_CLOSE = re.compile(r"^\s*-->\s*$")
HAS_MAIN = re.compile(r"^\s*int\s+main\s*\(", re.M)


class Block:
    def __init__(self, path, line, kind, reason, body, setup, setup_line):
        self.path = path          # relative to the source directory
        self.line = line          # the first line of the body (1-based)
        self.kind = kind          # "unit", "fragment" or "skip"
        self.reason = reason
        self.body = body          # list of lines, the fence's indent removed
        self.setup = setup        # list of lines, or []
        self.setup_line = setup_line


def find_setup(lines, fence):
    """Returns (setup lines, first line number) of a c-setup comment that
    ends right above the fence at index fence (blank lines between are
    allowed), or ([], 0)."""
    i = fence - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0 or not SETUP_CLOSE.match(lines[i]):
        return [], 0
    end = i
    while i >= 0 and not SETUP_OPEN.match(lines[i]):
        i -= 1
    if i < 0:
        return [], 0
    return lines[i + 1:end], i + 2


def blocks_of(root, rel):
    lines = open(os.path.join(root, rel), encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group(1), (m.group(2) or "").strip()
        j = i + 1
        while j < len(lines) and not CLOSE.match(lines[j]):
            j += 1
        if j == len(lines):
            sys.exit(f"{rel}:{i + 1}: a ```c block that never ends")
        body = [l[len(indent):] if l.startswith(indent) else l.lstrip()
                for l in lines[i + 1:j]]
        word, _, rest = info.partition(" ")
        if word == "":
            kind = "unit"
        elif word in ("fragment", "skip"):
            kind = word
        else:
            sys.exit(f"{rel}:{i + 1}: unknown ```c block kind '{word}' "
                     "(expected nothing, 'fragment' or 'skip REASON')")
        if kind == "skip" and not rest.strip():
            sys.exit(f"{rel}:{i + 1}: a ```c skip block must give a reason")
        setup, setup_line = find_setup(lines, i)
        yield Block(rel, i + 2, kind, rest.strip(), body, setup, setup_line)
        i = j + 1


def numbered(lines, first, path):
    """The lines under a #line directive, with elided ones blanked so that
    the numbering holds."""
    out = [f'#line {first} "{path}"']
    out += ["" if ELIDED.match(l) else l for l in lines]
    return out


def source_of(block):
    text = "\n".join(block.body)
    src = []
    if block.kind == "fragment" or "#include" not in text:
        src.append(PRELUDE)
    if block.setup:
        src += numbered(block.setup, block.setup_line, block.path)
    split = None
    for n, l in enumerate(block.body):
        if IN_MAIN.match(l):
            split = n
            break
    if block.kind == "fragment" and split is None:
        split = -1
    if split is None:
        src += numbered(block.body, block.line, block.path)
    else:
        top, stmts = block.body[:split + 1], block.body[split + 1:]
        if top:
            src += numbered(top, block.line, block.path)
        src.append("void fiber_doc_fragment(void);")
        src.append("void fiber_doc_fragment(void)\n{")
        src += numbered(stmts, block.line + split + 1, block.path)
        src.append("}")
    return "\n".join(src) + "\n", bool(HAS_MAIN.search(text))


def compile_one(block, workdir, root, libdir, cc):
    src, is_program = source_of(block)
    include = os.path.join(root, "include")
    stem = re.sub(r"[^A-Za-z0-9]", "_", f"{block.path}_{block.line}")
    c_file = os.path.join(workdir, stem + ".c")
    with open(c_file, "w", encoding="utf-8") as f:
        f.write(src)
    cmd = cc + WARNINGS + ["-I", include, "-I", root, c_file]
    if is_program:
        cmd += ["-o", os.path.join(workdir, stem), "-L", libdir, "-lfiber",
                f"-Wl,-rpath,{libdir}", "-lm"]
    else:
        cmd += ["-c", "-o", os.path.join(workdir, stem + ".o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return block, is_program, r.returncode, r.stdout + r.stderr


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    root, libdir, cc = sys.argv[1], sys.argv[2], sys.argv[3:]
    files = ["README.md"] + sorted(
        os.path.relpath(p, root)
        for p in glob.glob(os.path.join(root, "docs", "**", "*.md"),
                           recursive=True))
    blocks = [b for rel in files for b in blocks_of(root, rel)]
    skipped = [b for b in blocks if b.kind == "skip"]
    todo = [b for b in blocks if b.kind != "skip"]
    failed = 0
    linked = 0
    with tempfile.TemporaryDirectory(prefix="fiber-docs-") as workdir, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        jobs = [ex.submit(compile_one, b, workdir, root, libdir, cc)
                for b in todo]
        for job in jobs:
            block, is_program, rc, output = job.result()
            what = "program" if is_program else block.kind
            if rc != 0:
                failed += 1
                print(f"FAIL {block.path}:{block.line - 1}: this ```c block "
                      f"({what}) does not compile:\n{output}")
            else:
                linked += is_program
                print(f"ok   {block.path}:{block.line - 1} ({what})")
    for b in skipped:
        print(f"skip {b.path}:{b.line - 1}: {b.reason}")
    print(f"docs.c_examples: {len(todo) - failed} of {len(todo)} blocks "
          f"compile ({linked} programs linked against libfiber), "
          f"{failed} failed, {len(skipped)} skipped")
    if not todo:
        print("FAIL: no ```c block found: is the source directory right?")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
