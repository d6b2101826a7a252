#!/usr/bin/env python3
"""File-level module graph of a crate's src/: edges from `use crate::...`, `crate::x::` paths,
names the crate root re-exports (`crate::Name`, `use crate::{A, b::C}`: the module lib.rs's
`pub use` takes them from) and `super::` uses (lib.rs and #[cfg(test)] modules left out);
prints the edges and the cycles (strongly connected components).
Usage: scripts/modgraph.py [--check] rdma-cm/src   (--check: exit 1 if there is a cycle)"""
import os, re, sys
args = sys.argv[1:]
check = '--check' in args
args = [a for a in args if a != '--check']
if len(args) != 1:
    sys.exit(__doc__)
src = args[0]
files = {}
for root, _, fs in os.walk(src):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src)[:-3]
            mod = rel.replace('/mod', '').replace('/', '::')
            if mod in ('lib',):
                mod = 'crate'
            files[mod] = p
def strip_comments(t):
    t = re.sub(r'//[^\n]*', '', t)
    return re.sub(r'/\*.*?\*/', '', t, flags=re.S)
def strip_tests(t):
    # drop #[cfg(test)] / #[cfg(all(test...))] modules
    m = re.search(r'#\[cfg\((all\()?test[^\]]*\]\s*mod tests', t)
    return t[:m.start()] if m else t
# Names re-exported at the crate root: `pub use a::b::{X, Y}` / `pub use a::X;` -> module.
def resolve(path):
    """The module file a `crate::`-relative path names (its longest existing prefix)."""
    parts = path.split('::')
    for n in range(len(parts), 0, -1):
        cand = '::'.join(parts[:n])
        if cand in files and cand != 'crate':
            return cand
    return None
root_names = {}
lib = files.get('crate')
if lib:
    lt = strip_comments(open(lib).read())
    for m in re.finditer(r'\bpub\s+use\s+([a-z_][a-z0-9_:]*?)::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)\s*;', lt):
        mod = resolve(m.group(1).replace('crate::', ''))
        if not mod:
            continue
        for name in re.findall(r'[A-Za-z_][A-Za-z0-9_]*', m.group(2)):
            root_names.setdefault(name, mod)
def root_targets(t):
    out = set()
    for m in re.finditer(r'\bcrate::([A-Z][A-Za-z0-9_]*)', t):
        if m.group(1) in root_names:
            out.add(root_names[m.group(1)])
    for m in re.finditer(r'\buse\s+crate::\{([^;]*)\}\s*;', t):
        for item in re.split(r',', m.group(1)):
            item = item.strip()
            if not item:
                continue
            if '::' in item:
                mod = resolve(item.split('::{')[0].rsplit('::', 1)[0] if '::{' not in item else item.split('::{')[0])
                if mod:
                    out.add(mod)
            elif item in root_names:
                out.add(root_names[item])
    return out
edges = {m: set() for m in files}
for mod, p in files.items():
    t = strip_tests(strip_comments(open(p).read()))
    parent = mod.rsplit('::', 1)[0] if '::' in mod else 'crate'
    targets = root_targets(t)
    for m in re.finditer(r'\bcrate::([a-z_][a-z0-9_]*)(::([a-z_][a-z0-9_]*))?', t):
        a, b = m.group(1), m.group(3)
        if b and f'{a}::{b}' in files:
            targets.add(f'{a}::{b}')
        elif a in files:
            targets.add(a)
    for m in re.finditer(r'\bsuper::([a-z_][a-z0-9_]*)?', t):
        b = m.group(1)
        if b and f'{parent}::{b}' in files:
            targets.add(f'{parent}::{b}')
        elif parent in files:
            targets.add(parent)
    if mod == 'crate':
        targets = set()  # lib.rs only declares and re-exports
    targets.discard(mod)
    edges[mod] = targets
for m in sorted(edges):
    if m != 'crate':
        print(f'{m} -> {", ".join(sorted(edges[m])) or "(nothing)"}')
# Tarjan SCC
idx, low, st, on, out, n = {}, {}, [], set(), [], [0]
def sc(v):
    idx[v] = low[v] = n[0]; n[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in edges:
    if v not in idx: sc(v)
print('cycles:', out if out else 'none (acyclic)')
if check and out:
    sys.exit(1)
