#!/usr/bin/env python3
"""The module graph of our crates, and its two rules.

For each crate root (src/lib.rs, src/main.rs, src/bin/*.rs) the modules are those its
`mod x;` declarations reach; an edge a -> b is a use of b in a's file: a `crate::` path
(the longest prefix that is a module; a name the crate root re-exports stands for the
module it comes from), a `super::` path, or an item of a `use crate::{...}` / `use
super::{...}` tree. Comments and a trailing `#[cfg(test)] mod tests { ... }` are left out;
the root file itself only declares and re-exports, so it has no edges. A parent naming
its own child (`self::`, or a bare path) is not an edge.

The rules (`--check` exits 1 when one is broken):

1. No module circle in any crate (a strongly connected component of two or more
   modules).
2. In softiwarp, no upward import between its layer folders: a module may use only its
   own folder and the folders below it in LAYERS (docs/ARCHITECTURE.md, "Layers and
   crates" and "The soft device"). A folder or root module missing from LAYERS is an
   error too, so that a new one is placed on purpose.

Usage:
  scripts/modgraph.py [--check] [--quiet] CRATE/src [CRATE/src ...]
  scripts/modgraph.py [--check] [--quiet] --workspace    (every member of ./Cargo.toml
                                                          with a src/ folder)
Without --quiet the edges of each root are printed too."""
import os
import re
import sys

# softiwarp's layers, bottom up: each may use only the ones before it (and itself). The
# order is docs/ARCHITECTURE.md's ("The soft device"); root-level modules are placed
# like folders.
LAYERS = {
    'softiwarp': [
        'sync',             # std or loom primitives
        'progress_outbox',  # the progress lock's deferred wake-ups and calls
        'link',             # whole Ethernet frames
        'transport',        # smoltcp + MPA, sans-IO
        'resources',        # STag table, CQs, SRQs, event queues
        'host',             # the host-TCP transport (kernel sockets)
        'rdmap',            # the per-QP RDMAP engine and its binding to a connection
        'engine',           # the progress lock and the engine thread
        'api',              # Device and the verbs objects
        'spec',             # a device described in one line
        'cm',               # the device under iw-cm and rdma-cm
        'testing',          # test harnesses over the internals (feature `testing`)
    ],
}

IDENT = r'[A-Za-z_][A-Za-z0-9_]*'


def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', '', t, flags=re.S)
    return re.sub(r'//[^\n]*', '', t)


def strip_tests(t):
    """Drops a trailing inline test module (`#[cfg(test)] mod tests { ... }`)."""
    m = re.search(r'#\[cfg\((all\()?test[^\]]*\]\s*(pub\s+)?mod\s+' + IDENT + r'\s*\{', t)
    return t[:m.start()] if m else t


def modules_of(root):
    """{module path: file} of the crate whose root file is `root` ('crate' for the root),
    following `mod x;` declarations (inline modules are part of their file)."""
    files = {}

    def walk(mod, path, is_dir_owner):
        files[mod] = path
        text = strip_comments(open(path).read())
        base = os.path.dirname(path) if is_dir_owner else path[:-3]
        for m in re.finditer(r'(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(' + IDENT + r')\s*;', text):
            name = m.group(1)
            child = name if mod == 'crate' else f'{mod}::{name}'
            for cand, owner in ((os.path.join(base, name + '.rs'), False),
                                (os.path.join(base, name, 'mod.rs'), True)):
                if os.path.exists(cand):
                    walk(child, cand, owner)
                    break

    walk('crate', root, True)
    return files


def expand_use(tree):
    """Every path of a use tree: 'a::{b, c::{d, e}}' -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r'\s+as\s+' + IDENT, '', tree)
    tree = re.sub(r'\s+', '', tree)
    out = []

    def rec(prefix, s):
        i = s.find('{')
        if i < 0:
            for part in split_top(s):
                out.append(prefix + part)
            return
        head = s[:i]
        inner = s[i + 1:matching(s, i)]
        for part in split_top(inner):
            rec(prefix + head, part)

    rec('', tree)
    return out


def matching(s, i):
    depth = 0
    for j in range(i, len(s)):
        if s[j] == '{':
            depth += 1
        elif s[j] == '}':
            depth -= 1
            if depth == 0:
                return j
    return len(s)


def split_top(s):
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch == ',' and depth == 0:
            if cur:
                parts.append(cur)
            cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    if cur:
        parts.append(cur)
    return parts


class Crate:
    def __init__(self, root):
        self.files = modules_of(root)
        self.reexports = {}  # name at the root -> the path it comes from
        text = strip_comments(open(root).read())
        for m in re.finditer(r'\bpub(?:\([^)]*\))?\s+use\s+([^;]+);', text):
            for p in expand_use(m.group(1)):
                p = p.replace('crate::', '', 1) if p.startswith('crate::') else p
                name = p.rsplit('::', 1)[-1]
                self.reexports.setdefault(name, p)

    def resolve(self, parts, depth=0):
        """The module a crate-relative path names: its longest prefix that is a module
        (a re-exported name at the root stands for its source path)."""
        if not parts or depth > 8:
            return None
        if parts[0] not in self.files and parts[0] in self.reexports:
            src = self.reexports[parts[0]].split('::')
            if src[0] != parts[0]:
                return self.resolve(src + parts[1:], depth + 1)
        for n in range(len(parts), 0, -1):
            cand = '::'.join(parts[:n])
            if cand in self.files and cand != 'crate':
                return cand
        return None

    def edges(self):
        edges = {}
        for mod, path in self.files.items():
            targets = set()
            if mod != 'crate':
                t = strip_tests(strip_comments(open(path).read()))
                parent = mod.rsplit('::', 1)[0] if '::' in mod else 'crate'
                paths = []
                for m in re.finditer(r'\buse\s+([^;]+);', t):
                    paths += [p for p in expand_use(m.group(1))
                              if p.startswith(('crate::', 'super::'))]
                paths += re.findall(r'\b((?:crate|super)(?:::' + IDENT + ')+)', t)
                for p in paths:
                    parts = [x for x in p.split('::') if x and x != '*' and x != 'self']
                    if parts[0] == 'crate':
                        target = self.resolve(parts[1:])
                    else:
                        base = mod.split('::')
                        while parts and parts[0] == 'super':
                            parts = parts[1:]
                            base = base[:-1]
                        target = self.resolve(base + parts) or ('::'.join(base) or None)
                        if target and target not in self.files:
                            target = None
                    if target and target != mod and target != 'crate':
                        targets.add(target)
            edges[mod] = targets
        return edges


def cycles(edges):
    """Strongly connected components of two or more modules (Tarjan)."""
    idx, low, st, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def sc(v):
        idx[v] = low[v] = n[0]
        n[0] += 1
        st.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in idx:
                sc(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in idx:
            sc(v)
    return out


def layer_problems(order, edges):
    rank = {name: i for i, name in enumerate(order)}
    problems = []
    tops = {m.split('::')[0] for m in edges if m != 'crate'}
    for top in sorted(tops - set(rank)):
        problems.append(f'{top} is not in the layer order (scripts/modgraph.py LAYERS)')
    for a in sorted(edges):
        for b in sorted(edges[a]):
            ta, tb = a.split('::')[0], b.split('::')[0]
            if ta != tb and ta in rank and tb in rank and rank[tb] > rank[ta]:
                problems.append(f'upward import: {a} -> {b} ({ta} is below {tb})')
    return problems


def roots_of(src):
    roots = []
    for name in ('lib.rs', 'main.rs'):
        if os.path.exists(os.path.join(src, name)):
            roots.append((name[:-3], os.path.join(src, name)))
    bindir = os.path.join(src, 'bin')
    if os.path.isdir(bindir):
        for f in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, f)
            if f.endswith('.rs'):
                roots.append(('bin/' + f[:-3], p))
            elif os.path.exists(os.path.join(p, 'main.rs')):
                roots.append(('bin/' + f, os.path.join(p, 'main.rs')))
    return roots


def workspace_srcs():
    text = open('Cargo.toml').read()
    block = re.search(r'(?s)\[workspace\].*?members\s*=\s*\[(.*?)\]', text)
    members = re.findall(r'"([^"]+)"', block.group(1)) if block else []
    return [os.path.join(m, 'src') for m in members if os.path.isdir(os.path.join(m, 'src'))]


def crate_name(src):
    return os.path.basename(os.path.dirname(os.path.normpath(src)) or '.')


def main():
    args = sys.argv[1:]
    check = '--check' in args
    quiet = '--quiet' in args
    srcs = [a for a in args if not a.startswith('--')]
    if '--workspace' in args:
        srcs += workspace_srcs()
    if not srcs or any(a not in ('--check', '--quiet', '--workspace')
                       for a in args if a.startswith('--')):
        sys.exit(__doc__)
    failed = False
    for src in srcs:
        name = crate_name(src)
        for kind, root in roots_of(src):
            crate = Crate(root)
            edges = crate.edges()
            circles = cycles(edges)
            problems = [f'circle among: {", ".join(c)}' for c in circles]
            order = LAYERS.get(name) if kind == 'lib' else None
            if order:
                problems += layer_problems(order, edges)
            if not quiet:
                print(f'== {src} ({kind})')
                for m in sorted(edges):
                    if m != 'crate':
                        print(f'{m} -> {", ".join(sorted(edges[m])) or "(nothing)"}')
            status = 'no circle' + (', no upward import' if order else '')
            count = f'{len(edges)} module' + ('s' if len(edges) != 1 else '')
            if problems:
                failed = True
                print(f'{name} ({kind}, {count}): FAILED')
                for p in problems:
                    print(f'  {p}')
            else:
                print(f'{name} ({kind}, {count}): {status}')
    if check and failed:
        sys.exit(1)


if __name__ == '__main__':
    main()
