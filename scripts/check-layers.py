#!/usr/bin/env python3
"""Checks that src/'s layers only point down (docs/architecture.md, "Layers").

    check-layers.py [SOURCE_DIR]

Reads every .c and .h under SOURCE_DIR/src (default: this script's
repository) and fails, naming the file, the line and what is wrong, when:

  1. a file includes a header of a higher layer.  The layers, lowest first:
         base < wire < net < runtime < concepts < init < tool
     and among the concepts (one folder each):
         future < store < objsrv < queue, ring, manager, process, runs
                                 < pipe, pool
     A folder may include its own headers and any lower layer's.  The
     backends (backend/) sit beside the runtime: the runtime reaches them
     only through backend/backend.h and backend/runops.h (the ops tables
     and the registry), and a backend uses of the runtime only what those
     tables hand it (runtime/config.h, runtime/runid.h);
  2. a backend is named outside its folder and the registry: a file
     outside backend/<name>/ includes backend/<name>/ (backend/http/ is a
     helper any backend may use), or code outside backend/ spells a
     backend's name as a string ("slurm"), an engine's variable
     ("SLURM_..."), or a backend's configuration field (slurm_partition);
  3. a header private to its folder is included from outside it: the
     inside of a connection (net/conn_int.h: only src/net/ sees struct
     fb_conn's fields) and the encryption's internals (net/secure.h).
     This rule also reads tests/, bench/, examples/ and python/src/: no
     file anywhere outside the folder may include its private headers.

Comments are not code: a comment may say "slurm".  What cannot be fixed
yet is in ALLOWED below, each entry with the reason and the issue that
will remove it; an entry that no longer matches anything fails the check
too, so the list only shrinks.

Exit status: 0 clean, 1 with the problems listed, 2 usage.
"""
import os
import re
import sys

# Layer of each folder of src/ (its first path component; backend/<name>/
# is backend).  Equal numbers: beside each other, neither includes the
# other (but for the runtime/backend interface below).
LAYER = {
    "base": 0,
    "wire": 1,
    "net": 2,
    "runtime": 3,
    "backend": 3,
    "future": 4,
    "store": 5,
    "objsrv": 6,
    "queue": 7,
    "ring": 7,
    "manager": 7,
    "process": 7,
    "runs": 7,
    "pipe": 8,
    "pool": 8,
    "init": 9,
    "tool": 10,
}

# The interface between the runtime and the backends (same layer).
RUNTIME_MAY_INCLUDE = {"backend/backend.h", "backend/runops.h"}
BACKEND_MAY_INCLUDE = {"runtime/config.h", "runtime/runid.h"}
# Folders under backend/ that are helpers, not backends.
BACKEND_HELPERS = {"http"}
# The registry: the files of backend/ itself (backend.c, runops.h...).
BACKENDS = ("local", "docker", "slurm", "kubernetes")

# (file under src/, regular expression over the offending code, why).
# Every entry names the issue that removes it; none may be stale.
ALLOWED = [
    ("runtime/config.c", r'"local"',
     "the backend key's documented default value (issue 27: kept; the "
     "default backend is part of the configuration table)"),
    ("runtime/config.c", r"\b(docker|slurm|k8s)_\w+",
     "issue 27, left for later: each backend's configuration keys still "
     "live in the one key table instead of its folder"),
    ("runtime/config.h", r"\b(docker|slurm|k8s)_\w+",
     "issue 27, left for later: each backend's configuration fields still "
     "live in struct fb_config instead of its folder"),
]

# Headers private to their folder: (header under src/, the folder).
PRIVATE = {
    "net/conn_int.h": "net",
    "net/secure.h": "net",
}
# Besides src/, the folders whose includes rule 3 reads.
OTHER_DIRS = ("tests", "bench", "examples", "python/src")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
BACKEND_STRING = re.compile(r'"(%s)"' % "|".join(BACKENDS))
ENGINE_VAR = re.compile(r'"(SLURM|KUBERNETES|DOCKER)_\w*')
BACKEND_FIELD = re.compile(r"\b(docker|slurm|k8s)_\w+")


def strip_comments(text):
    """The text with comments blanked (strings kept, lines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def folder_of(rel):
    """('backend', 'slurm') for backend/slurm/x.c, ('pool', None) for pool/x.c."""
    parts = rel.split("/")
    if parts[0] == "backend" and len(parts) > 2:
        return "backend", parts[1]
    return parts[0], None


def private_problem(rel, target):
    """Rule 3: rel (a path under src/, or "../tests/..." beside it)
    includes a header private to another folder."""
    owner = PRIVATE.get(target)
    if owner is None or rel.startswith(owner + "/"):
        return None
    return ("private to src/%s/: only its own files may include it (use "
            "the functions its public header declares)" % owner)


def other_problems(root):
    """Rule 3 over the folders outside src/."""
    problems = []
    for top in OTHER_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith((".c", ".h", ".cc", ".cpp")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                code = strip_comments(open(path, encoding="utf-8",
                                           errors="replace").read())
                for no, line in enumerate(code.split("\n"), 1):
                    m = INCLUDE.match(line)
                    why = m and private_problem("../" + rel, m.group(1))
                    if why:
                        problems.append("%s:%d: #include \"%s\": %s" %
                                        (rel, no, m.group(1), why))
    return problems


def include_problem(rel, target, src_dir):
    private = private_problem(rel, target)
    if private:
        return private
    top, sub = folder_of(rel)
    if "/" not in target:  # a header beside the file ("tool.h")
        here = os.path.join(src_dir, os.path.dirname(rel), target)
        return None if os.path.exists(here) else "no such header beside it"
    if target.startswith("fiber/"):
        return None  # the public API
    ttop, tsub = folder_of(target)
    if ttop not in LAYER:
        return "includes from %s/, which is no layer of src/" % ttop
    if top not in LAYER:
        return "%s/ is no layer of src/ (add it to LAYER)" % top
    if ttop == "backend" and tsub and tsub not in BACKEND_HELPERS:
        if top != "backend" or (sub != tsub):
            return ("names backend %s outside its folder (go through "
                    "backend/backend.h or backend/runops.h)" % tsub)
        return None
    if ttop == top:
        return None
    if top == "runtime" and ttop == "backend":
        if target in RUNTIME_MAY_INCLUDE:
            return None
        return ("the runtime reaches the backends only through %s" %
                " and ".join(sorted(RUNTIME_MAY_INCLUDE)))
    if top == "backend" and ttop == "runtime":
        if target in BACKEND_MAY_INCLUDE:
            return None
        return ("a backend takes from the runtime only what backend.h hands "
                "it (%s); pass the rest as parameters" %
                ", ".join(sorted(BACKEND_MAY_INCLUDE)))
    if LAYER[ttop] >= LAYER[top]:
        return ("%s/ (layer %d) includes from %s/ (layer %d): layers point "
                "down only" % (top, LAYER[top], ttop, LAYER[ttop]))
    return None


def main(argv):
    if len(argv) > 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    src_dir = os.path.join(root, "src")
    problems = []
    used = set()
    files = 0
    for dirpath, _, names in os.walk(src_dir):
        for name in sorted(names):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src_dir).replace(os.sep, "/")
            files += 1
            text = open(path, encoding="utf-8", errors="replace").read()
            code = strip_comments(text)
            bare = re.sub(r'"(\\.|[^"\\\n])*"', '""', code)
            for no, (line, bare_line) in enumerate(
                    zip(code.split("\n"), bare.split("\n")), 1):
                m = INCLUDE.match(line)
                if m:
                    why = include_problem(rel, m.group(1), src_dir)
                    if why:
                        problems.append("src/%s:%d: #include \"%s\": %s" %
                                        (rel, no, m.group(1), why))
                    continue
                if rel.startswith("backend/"):
                    continue
                # Names in strings; fields in code (help text may name a
                # key).
                for rx, what, text_ in (
                        (BACKEND_STRING, "a backend's name", line),
                        (ENGINE_VAR, "an engine's variable", line),
                        (BACKEND_FIELD, "a backend's configuration field",
                         bare_line)):
                    for hit in rx.finditer(text_):
                        allowed = [i for i, (f, pat, _) in enumerate(ALLOWED)
                                   if f == rel and re.fullmatch(pat, hit.group(0))]
                        if allowed:
                            used.update(allowed)
                            continue
                        problems.append(
                            "src/%s:%d: %s outside backend/: %s (ask the "
                            "registry or a backend op instead)" %
                            (rel, no, what, hit.group(0)))
    problems.extend(other_problems(root))
    for i, (f, pat, why) in enumerate(ALLOWED):
        if i not in used:
            problems.append("ALLOWED entry for src/%s /%s/ matches nothing: "
                            "remove it (%s)" % (f, pat, why))
    for p in problems:
        print(p)
    print("check-layers: %d files, %d problem(s), %d allowed exception(s)" %
          (files, len(problems), len(used)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
