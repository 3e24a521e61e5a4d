#!/usr/bin/env python3
"""config_keys.py -- docs/configuration.md's keys are the code's keys.

ctest `docs.config_keys`.  Usage:

    config_keys.py SOURCE_DIR CONFIG_DEFAULTS

Reads the key table of src/runtime/config.c (FB_CONFIG_KEYS: name, kind,
range) and its lists of choices (log_level_names, ...; the backends are
src/backend/backend.c's registry), asks the library
for each key's built-in value (CONFIG_DEFAULTS, tests/docs/config_defaults.c,
run with no FIBER_* variable and no .fiberconfig), and checks against the
table under "## Keys" in docs/configuration.md:

  - every key of the code is documented, and every documented key exists;
  - the documented type is the key's kind (the choice kinds read "choice");
  - the documented default is the built-in value ("empty..." for "");
  - an integer or size key's documented range "A to B" is its min and max;
  - a choice key's documented values are the code's choices;
  - the keys named in "## When a value takes effect" exist, and every key
    is there;
  - every "known keys: ..." message quoted in docs/ lists the code's keys,
    in the code's order (a list that ends in "..." is a shortened quote).

Prints one line per problem, naming the file and line, and fails if there
is any.
"""

import glob
import os
import re
import subprocess
import sys
import tempfile

CHOICE_KINDS = {"backend": "backend_names", "log_level": "log_level_names",
                "transport": "transport_names",
                "pull_policy": "pull_policy_names"}
RANGE_KINDS = ("integer", "size")


def code_table(root):
    path = os.path.join(root, "src", "runtime", "config.c")
    text = open(path, encoding="utf-8").read()
    start = text.index("#define FB_CONFIG_KEYS(X)")
    end = text.index("\n\n", start)
    table = text[start:end].replace("\\\n", " ")
    keys = []
    for m in re.finditer(r"X\((\w+),\s*(STR|INT|U32),\s*(.*?),\s*(\w+),"
                         r"\s*(-?\d+),\s*(-?\d+)\)", table):
        keys.append({"name": m.group(1), "kind": m.group(4),
                     "min": int(m.group(5)), "max": int(m.group(6))})
    if not keys:
        sys.exit(f"FAIL {path}: no FB_CONFIG_KEYS entry found")
    choices = {}
    for m in re.finditer(r"static const char \*const (\w+)\[\]\s*=\s*\{(.*?)\};",
                         text, re.S):
        choices[m.group(1)] = re.findall(r'"([^"]*)"', m.group(2))
    # The backend key's choices are the registry's backends, in its order.
    registry = open(os.path.join(root, "src", "backend", "backend.c"),
                    encoding="utf-8").read()
    choices["backend_names"] = re.findall(r"&fb_run_ops_(\w+)\}", registry)
    if not choices["backend_names"]:
        sys.exit("FAIL src/backend/backend.c: no registry line found")
    return keys, choices


def code_defaults(helper, names):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}
    helper = os.path.abspath(helper)
    if not os.access(helper, os.X_OK):
        sys.exit(f"FAIL {helper}: not an executable (build docs_config_defaults)")
    with tempfile.TemporaryDirectory(prefix="fiber-docs-") as cwd:
        r = subprocess.run([helper] + names, cwd=cwd, env=env,
                           capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL {helper}: {r.stderr.strip()}")
    return dict(line.split("\t", 1) for line in r.stdout.splitlines())


def doc_sections(lines):
    """Yields (title, index of the heading) of every '## ' heading."""
    for i, l in enumerate(lines):
        if l.startswith("## "):
            yield l[3:].strip(), i


def table_rows(lines, heading):
    """The rows (line number, cells) of the first table after the heading
    at index heading, header and rule left out."""
    rows = []
    i = heading + 1
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    i += 2
    while i < len(lines) and lines[i].startswith("|"):
        # "\|" stands for a | inside a cell.
        cells = [c.strip() for c in
                 re.split(r"(?<!\\)\|", lines[i].strip().strip("|"))]
        rows.append((i + 1, cells))
        i += 1
    return rows


def ticked(cell):
    return re.findall(r"`([^`]*)`", cell)


def check(root, helper):
    keys, choices = code_table(root)
    names = [k["name"] for k in keys]
    defaults = code_defaults(helper, names)
    doc = "docs/configuration.md"
    lines = open(os.path.join(root, doc), encoding="utf-8").read().split("\n")
    sections = dict(doc_sections(lines))
    problems = []

    def problem(line, text):
        problems.append(f"{doc}:{line}: {text}")

    if "Keys" not in sections:
        return [f"{doc}: no '## Keys' section"], len(names)
    documented = {}
    for line, cells in table_rows(lines, sections["Keys"]):
        if len(cells) != 4 or not ticked(cells[0]):
            problem(line, f"a row of the key table that is not "
                          f"| `key` | type | default | accepted values |")
            continue
        documented[ticked(cells[0])[0]] = (line, cells)
    by_name = {k["name"]: k for k in keys}
    for name in names:
        if name not in documented:
            problem(sections["Keys"] + 1,
                    f"key '{name}' is in src/runtime/config.c but not in the "
                    f"table of keys")
    for name, (line, (_, dtype, ddefault, accepted)) in documented.items():
        k = by_name.get(name)
        if k is None:
            problem(line, f"key '{name}' is documented but src/runtime/config.c "
                          f"has no such key")
            continue
        kind = "choice" if k["kind"] in CHOICE_KINDS else k["kind"]
        if dtype != kind:
            problem(line, f"key '{name}': documented type '{dtype}', the "
                          f"code's kind is '{kind}'")
        actual = defaults[name]
        if ddefault.startswith("empty"):
            if actual != "":
                problem(line, f"key '{name}': documented default is empty, "
                              f"the code's is '{actual}'")
        elif not ticked(ddefault) or ticked(ddefault)[0] != actual:
            problem(line, f"key '{name}': documented default {ddefault}, "
                          f"the code's is '{actual}'")
        if k["kind"] in RANGE_KINDS:
            m = re.match(r"(-?\d+) to (-?\d+)", accepted)
            if not m or (int(m.group(1)), int(m.group(2))) != (k["min"],
                                                               k["max"]):
                problem(line, f"key '{name}': documented range "
                              f"'{accepted}', the code's is {k['min']} to "
                              f"{k['max']}")
        if k["kind"] in CHOICE_KINDS:
            want = [c for c in choices[CHOICE_KINDS[k["kind"]]] if c]
            if ticked(accepted) != want:
                problem(line, f"key '{name}': documented values "
                              f"{ticked(accepted)}, the code's are {want}")

    when = "When a value takes effect"
    if when not in sections:
        problem(1, f"no '## {when}' section")
    else:
        seen = set()
        for line, cells in table_rows(lines, sections[when]):
            for name in ticked(cells[0]):
                if name not in by_name:
                    problem(line, f"'{when}' names key '{name}', which "
                                  f"src/runtime/config.c does not have")
                seen.add(name)
        for name in names:
            if name not in seen:
                problem(sections[when] + 1,
                        f"key '{name}' is missing from '{when}'")

    known = ", ".join(names)
    for path in sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"),
                                 recursive=True)) + [
                                     os.path.join(root, "README.md")]:
        rel = os.path.relpath(path, root)
        for n, l in enumerate(open(path, encoding="utf-8"), 1):
            for m in re.finditer(r"known keys: ([a-z0-9_, .]+)", l):
                quoted = m.group(1).rstrip(". ")
                if m.group(1).rstrip().endswith("..."):
                    if not known.startswith(quoted.rstrip(", .")):
                        problems.append(f"{rel}:{n}: a quoted 'known keys' "
                                        f"list that is not the code's")
                elif quoted != known:
                    problems.append(f"{rel}:{n}: the quoted 'known keys' "
                                    f"list is not the code's: {known}")
    return problems, len(names)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    problems, n = check(sys.argv[1], sys.argv[2])
    for p in problems:
        print("FAIL " + p)
    print(f"docs.config_keys: {n} keys in src/runtime/config.c, "
          f"{len(problems)} problems in the docs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
