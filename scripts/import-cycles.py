#!/usr/bin/env python3
"""Import cycles between the library's files: a graph of `use crate::...` paths (and
`crate::a::b` paths written inline), file to file, and its strongly connected components
of more than one file. Prints each cycle's files; exits 1 if there is any."""
import os, re, sys
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'src')
files = {}
for dirpath, _, names in os.walk(root):
    for name in names:
        if name.endswith('.rs'):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)[:-3].replace(os.sep, '::')
            mod = rel[:-len('::mod')] if rel.endswith('::mod') else ('' if rel in ('lib',) else rel)
            files[mod] = path
def resolve(path):
    parts = path.split('::')
    for n in range(len(parts), 0, -1):
        cand = '::'.join(parts[:n])
        if cand in files:
            return cand
    return None
graph = {m: set() for m in files}
for mod, path in files.items():
    text = open(path).read()
    # Only the code before the unit-test module counts.
    text = re.split(r'\n#\[cfg\((?:all\()?test', text)[0]
    text = re.sub(r'//.*', '', text)
    for m in re.finditer(r'crate::((?:\w+::)*\w+)(::\{([^}]*)\})?', text):
        base = m.group(1)
        targets = [base]
        if m.group(3):
            targets = [base + '::' + t.strip().split(' ')[0].split('::')[0] for t in m.group(3).split(',') if t.strip()]
        for t in targets:
            r = resolve(t)
            if r is not None and r != mod and r != '':
                graph[mod].add(r)
# Tarjan's SCC.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in graph[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in graph:
    if v not in index: visit(v)
for comp in sccs:
    print('cycle:', ', '.join(comp))
print(f'{len(sccs)} import cycle(s) among {len(files)} files')
sys.exit(1 if sccs else 0)
