#!/usr/bin/env python3
"""Each library includes only what it links: tests/layering.py LINKS.json

LINKS.json is written by CMake (the end of the top-level CMakeLists.txt): for
every rackstep library target, its sources and the libraries it links. A
header belongs to the target that compiles its .cpp/.cu (sim/layout.h ->
rackstep_sim_shared), else to the target with most sources in its folder
(sim/base/check.h -> rackstep_base); a header in a folder no library compiles
(scripts/cli/command.h) belongs to no library. Every `#include "dir/file"` of
a target's sources and headers must name a header of that target or of one it
links, directly or through others. So exec cannot include a sim/ header
outside the base and the part of sim exec links, and no library includes a
command-line header. Exit 0 when every include is declared, 1 with one line
per undeclared include.
"""
import json
import os
import re
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = {"sim", "exec", "models", "topologies", "gui", "scripts", "tests", "bench"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rel(path):
    return os.path.relpath(path, ROOT)


def main():
    with open(sys.argv[1]) as f:
        targets = json.load(f)
    # Sources are absolute or relative to the folder whose CMakeLists.txt made the target.
    sources = {t: [rel(os.path.join(v["dir"], s)) for s in v["sources"].split("|") if s] for t, v in targets.items()}
    links = {t: [l for l in v["links"].split("|") if l in targets] for t, v in targets.items()}

    # Which target compiles each file; which target has most sources per folder.
    owner = {}
    by_dir = {}
    for t, srcs in sources.items():
        for s in srcs:
            owner[s] = t
            by_dir.setdefault(os.path.dirname(s), Counter())[t] += 1

    def header_owner(h):
        stem = os.path.splitext(h)[0]
        for ext in (".cpp", ".cu"):
            if stem + ext in owner:
                return owner[stem + ext]
        d = by_dir.get(os.path.dirname(h))
        return d.most_common(1)[0][0] if d else None

    def closure(t):
        seen, todo = {t}, [t]
        while todo:
            for l in links[todo.pop()]:
                if l not in seen:
                    seen.add(l)
                    todo.append(l)
        return seen

    headers = {}
    for dirpath, _, names in os.walk(ROOT):
        r = rel(dirpath)
        if r.split(os.sep)[0] not in TOP:
            continue
        for n in names:
            if n.endswith((".h", ".cuh", ".hpp")):
                h = os.path.join(r, n)
                o = header_owner(h)
                if o:
                    headers.setdefault(o, []).append(h)

    errors, checked = [], 0
    for t in sorted(targets):
        allowed = closure(t)
        for f in sorted(set(sources[t] + headers.get(t, []))):
            if not f.endswith((".cpp", ".cu", ".h", ".cuh", ".hpp")):
                continue
            with open(os.path.join(ROOT, f), errors="replace") as fh:
                text = fh.read()
            for inc in INCLUDE.findall(text):
                if inc.split("/")[0] not in TOP:
                    continue
                checked += 1
                o = header_owner(inc)
                if o in allowed:
                    continue
                what = f"{o}, which {t} does not link" if o else "a header of no library (the rackstep command's)"
                errors.append(f"{f} ({t}) includes {inc}: {what}")
    for e in errors:
        print(f"layering: {e}")
    print(f"layering: {checked} includes in {len(targets)} libraries checked, {len(errors)} undeclared")
    return 1 if errors or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
