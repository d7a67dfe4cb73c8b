#!/usr/bin/env python3
"""Checks that src/ imports only downward: each module imports only from layers below
its own. The layers are read from the numbered list under "## Layers" in src/lib.rs,
so the documentation and the check cannot drift. A module missing from the list is an
error too. Exit 1 names every upward (or same-layer) import with file and line."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")


def layers():
    text = open(os.path.join(SRC, "lib.rs")).read()
    section = text.split("//! ## Layers", 1)[1]
    out = {}
    entry = None
    for line in section.splitlines()[1:]:
        if not line.startswith("//!"):
            break
        m = re.match(r"//! (\d+)\. (.*)", line)
        if m:
            entry = int(m.group(1))
            rest = m.group(2)
        elif entry is not None and line.startswith("//!    "):
            rest = line
        else:
            entry = None if not line.strip("/! ") else entry
            continue
        # Module names are the backquoted words before the dash.
        for name in re.findall(r"`([a-z_]+)`", rest.split(" — ")[0]):
            out[name] = entry
    return out


def module_of(path):
    rel = os.path.relpath(path, SRC)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def main():
    layer = layers()
    problems = []
    for dirpath, _, files in os.walk(SRC):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, ROOT)
            if rel in ("src/lib.rs", "src/main.rs"):
                continue
            me = module_of(path)
            if me not in layer:
                problems.append(f"{rel}: module `{me}` is not in the layer list of src/lib.rs")
                continue
            for n, line in enumerate(open(path), 1):
                code = line.split("//", 1)[0]
                for dep in re.findall(r"crate::([a-z_]+)", code):
                    if dep == me:
                        continue
                    if dep not in layer:
                        problems.append(f"{rel}:{n}: imports `{dep}`, which is not in the layer list")
                    elif layer[dep] >= layer[me]:
                        problems.append(
                            f"{rel}:{n}: `{me}` (layer {layer[me]}) imports `{dep}` (layer {layer[dep]})"
                        )
    if problems:
        print("layer check failed (src/lib.rs lists the layers):")
        print("\n".join(problems))
        sys.exit(1)
    print(f"layers: {len(set(layer.values()))} layers, {len(layer)} modules, no upward import")


if __name__ == "__main__":
    main()
