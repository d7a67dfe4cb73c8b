#!/usr/bin/env python3
"""Checks that the folders of src/ are layers and src/ imports only downward.

The layers are read from the numbered list under "## Layers" in src/lib.rs (one
folder, or `node` for src/node.rs, per entry, bottom to top), so the documentation and
the check cannot drift. For every library file under src/:
  * it sits in a listed folder (or is src/node.rs);
  * each `crate::<folder>` it names is its own folder or one listed below it;
  * `crate::<own folder>::<module>` imports between the modules of one folder form no
    circle (a folder is one subsystem, its modules ordered by their imports).
src/main.rs and the binary's src/cli/ are not the library: they may use any of it, and
the library must never name them (`crate::cli`). Exit 1 names every problem with file
and line."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
BINARY_ONLY = ("main.rs", "cli")


def layers():
    """{folder: layer number} from src/lib.rs."""
    text = open(os.path.join(SRC, "lib.rs")).read()
    section = text.split("//! ## Layers", 1)[1]
    out = {}
    for line in section.splitlines()[1:]:
        if not line.startswith("//!"):
            break
        m = re.match(r"//! (\d+)\. `([a-z_]+)`", line)
        if m:
            out[m.group(2)] = int(m.group(1))
    return out


def place(path):
    """(folder, module within the folder or None) of a file under src/."""
    parts = os.path.relpath(path, SRC).split(os.sep)
    folder = parts[0][:-3] if parts[0].endswith(".rs") else parts[0]
    module = None
    if len(parts) > 1:
        module = parts[1][:-3] if parts[1].endswith(".rs") else parts[1]
    return folder, module


def circles(edges):
    """Every module of `edges` ({module: {module}}) that lies on a circle."""
    on = set()
    for start in edges:
        seen, todo = set(), list(edges[start])
        while todo:
            m = todo.pop()
            if m == start:
                on.add(start)
                break
            if m not in seen:
                seen.add(m)
                todo.extend(edges.get(m, ()))
    return on


def main():
    layer = layers()
    problems = []
    within = {}  # folder -> {module: {module it imports from the same folder}}
    files = 0
    for dirpath, _, names in os.walk(SRC):
        for f in sorted(names):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, ROOT)
            folder, module = place(path)
            if rel == "src/lib.rs" or folder in ("main", "cli"):
                continue
            files += 1
            if folder not in layer:
                problems.append(f"{rel}: folder `{folder}` is not in the layer list of src/lib.rs")
                continue
            for n, line in enumerate(open(path), 1):
                code = line.split("//", 1)[0]
                for dep, sub in re.findall(r"crate::([a-z_]+)(?:::([a-z_]+))?", code):
                    if dep == "cli":
                        problems.append(f"{rel}:{n}: the library names the binary's `cli`")
                    elif dep not in layer:
                        problems.append(f"{rel}:{n}: imports `{dep}`, which is not in the layer list")
                    elif layer[dep] > layer[folder]:
                        problems.append(
                            f"{rel}:{n}: `{folder}` (layer {layer[folder]}) imports `{dep}` (layer {layer[dep]})")
                    elif dep == folder and module and sub and sub != module:
                        within.setdefault(folder, {}).setdefault(module, set()).add(sub)
    for folder, edges in sorted(within.items()):
        for m in sorted(circles(edges)):
            problems.append(f"src/{folder}/: `{m}` is on an import circle within the folder "
                            f"({folder}: {dict(sorted((k, sorted(v)) for k, v in edges.items()))})")
    if problems:
        print("layer check failed (src/lib.rs lists the layers):")
        print("\n".join(problems))
        sys.exit(1)
    print(f"layers: {len(layer)} folders, {files} files, no upward import, no circle within a folder")


if __name__ == "__main__":
    main()
