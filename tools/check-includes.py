#!/usr/bin/env python3
"""Checks the layering of src/: every `#include "folder/file.h"` of a file in src/<layer>/ must
follow an edge of the graph in docs/design.md (its ```layers block: "layer: what it may include"),
and no file anywhere in the tree includes a .c file.

    python3 tools/check-includes.py          # exit 0 when the tree follows the graph
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = ('.c', '.h', '.cu', '.cuh', '.cc', '.cpp')


def read_graph(path):
    """The ```layers block of docs/design.md: {layer: set of layers it may include}."""
    text = open(path, encoding='utf-8').read()
    m = re.search(r'^```layers\n(.*?)^```', text, re.M | re.S)
    if not m:
        sys.exit(f'{path}: no ```layers block (the allowed include graph)')
    graph = {}
    for line in m.group(1).splitlines():
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        name, _, deps = line.partition(':')
        graph[name.strip()] = set(deps.split())
    for name, deps in graph.items():
        unknown = deps - graph.keys()
        if unknown:
            sys.exit(f'{path}: layer {name} may include unknown layers {sorted(unknown)}')
    return graph


def tracked_files():
    """Every source file under the tree (build folders and hidden ones skipped)."""
    for top, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(top, ROOT)
        dirs[:] = [d for d in dirs if not d.startswith('.') and not d.startswith('build')]
        if rel == '.':
            dirs[:] = [d for d in dirs if d not in ('build',)]
        for f in files:
            if f.endswith(SOURCES):
                yield os.path.join(rel, f) if rel != '.' else f


def main():
    graph = read_graph(os.path.join(ROOT, 'docs', 'design.md'))
    errors = []
    layers_seen = set()
    for rel in sorted(tracked_files()):
        text = open(os.path.join(ROOT, rel), encoding='utf-8', errors='replace').read()
        parts = rel.split(os.sep)
        layer = parts[1] if parts[0] == 'src' and len(parts) > 2 else None
        if parts[0] == 'src' and len(parts) > 2 and layer not in graph:
            errors.append(f'{rel}: folder src/{layer} is not a layer of docs/design.md')
            continue
        if layer:
            layers_seen.add(layer)
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            line = text.count('\n', 0, m.start()) + 1
            if target.endswith(('.c', '.cu', '.cc', '.cpp')):
                errors.append(f'{rel}:{line}: includes a source file ({target}); '
                              'use a header')
                continue
            if layer is None or '/' not in target:
                continue
            dep = target.split('/', 1)[0]
            if dep == '..' or target.startswith('../'):
                errors.append(f'{rel}:{line}: relative include {target}')
            elif dep in graph and dep != layer and dep not in graph[layer]:
                errors.append(f'{rel}:{line}: {layer} -> {dep} ({target}) is not an edge of '
                              f'docs/design.md ({layer} may include: '
                              f'{" ".join(sorted(graph[layer])) or "nothing"})')
    missing = set(graph) - layers_seen
    for layer in sorted(missing):
        errors.append(f'docs/design.md names layer {layer}, but src/{layer} holds no source')
    for e in errors:
        print(e)
    if errors:
        print(f'check-includes: {len(errors)} problem(s)')
        return 1
    print(f'check-includes: {len(layers_seen)} layers, every include follows docs/design.md')
    return 0


if __name__ == '__main__':
    sys.exit(main())
