#!/usr/bin/env bash
# Prints a crate's module graph and its import cycles, at two levels: the top-level
# folders (link, transport, rdmap, ...) and the files. An edge A -> B is a
# `crate::...` or `super::...` path in A's code (comments and strings left out) that
# names B or an item of B; a file is never said to depend on its own folder's mod.rs
# or lib.rs through the module declarations alone. Child modules written as parts of
# their parent (`engine.rs` + `engine/tx.rs`, an `impl` of the parent's type split by
# concern) are folded into the parent at file level.
#
# Usage: scripts/module-cycles.sh [crate-src-dir]   (default softiwarp/src)
# Exits 1 if either level has a cycle.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "${1:-softiwarp/src}" <<'EOF'
import os, re, sys

src = sys.argv[1]

def mod_path(rel):
    parts = rel[:-3].split('/')
    if parts[-1] in ('mod', 'lib'):
        parts = parts[:-1]
    return tuple(parts)

files = {}
for d, _, fs in os.walk(src):
    for f in fs:
        if f.endswith('.rs'):
            rel = os.path.relpath(os.path.join(d, f), src)
            files[mod_path(rel)] = rel

def strip(text):
    """Code without comments, string and char literals (braces kept balanced)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            i = n if j < 0 else j + 2
        elif c == 'r' and re.match(r'r#*"', text[i:i + 8]) and not re.match(r'\w', text[i - 1:i]):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            j = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if j < 0 else j + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:i + 4]).group(0))
        else:
            out.append(c)
            i += 1
    return ''.join(out)

def expand_use(tree):
    """Paths of a use tree, e.g. `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r'\s+', '', tree)
    m = re.match(r'^([\w:]*?)(?:::)?\{(.*)\}$', tree)
    if not m:
        return [tree]
    prefix, body = m.group(1), m.group(2)
    items, depth, cur = [], 0, ''
    for ch in body:
        if ch == ',' and depth == 0:
            items.append(cur); cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    items.append(cur)
    res = []
    for it in filter(None, items):
        for p in expand_use(it):
            res.append(prefix + ('::' + p if p and p != 'self' else ''))
    return res

def absolute(mp, p):
    """`p` (a path written in module `mp`) from the crate root."""
    segs = p.split('::')
    if segs[0] == 'crate':
        return tuple(segs[1:])
    base = list(mp)
    if segs[0] == 'self':
        segs = segs[1:]
    while segs and segs[0] == 'super':
        base.pop(); segs = segs[1:]
    return tuple(base) + tuple(segs)

# Re-exports (`pub use` / `pub(crate) use`): a name of a module that stands for an item
# of another one, e.g. the crate root's `Device` for `api::device::Device`.
reexports = {}
for mp, rel in files.items():
    code = re.sub(r'//[^\n]*', '', open(os.path.join(src, rel)).read())
    for m in re.finditer(r'\bpub(?:\([\w:]+\))?\s+use\s+([^;]+);', code):
        for p in expand_use(m.group(1)):
            target = absolute(mp, p)
            reexports[mp + (target[-1],)] = target

def resolve(path, depth=0):
    """The file that defines what `path` (a tuple) names: its longest module prefix
    that is a file, followed through re-exports."""
    for k in range(len(path), -1, -1):
        if path[:k] in files:
            alias = path[:k + 1]
            if k < len(path) and alias in reexports and depth < 20:
                return resolve(reexports[alias] + path[k + 1:], depth + 1)
            return path[:k]
    return ()

edges = {}
for mp, rel in files.items():
    code = strip(open(os.path.join(src, rel)).read())
    # Inline modules (`mod tests { ... }`): their `super::` is the file's module.
    spans, depth, stack = [], 0, []
    for m in re.finditer(r'\bmod\s+(\w+)\s*\{|[{}]', code):
        tok = m.group(0)
        if tok.startswith('mod'):
            stack.append((depth, m.start()))
            depth += 1
        elif tok == '{':
            depth += 1
        else:
            depth -= 1
            if stack and stack[-1][0] == depth:
                spans.append((stack.pop()[1], m.end()))
    def base_at(pos):
        extra = sum(1 for a, b in spans if a <= pos < b)
        return mp + ('<inline>',) * extra
    targets = set()
    uses = [(m.start(), p) for m in re.finditer(r'\buse\s+([^;]+);', code) for p in expand_use(m.group(1))]
    bare = [(m.start(), m.group(0)) for m in re.finditer(r'\b(?:crate|super)(?:::\w+)+', code)]
    for pos, p in uses + bare:
        segs = p.split('::')
        if segs[0] == 'crate':
            path = tuple(segs[1:])
        elif segs[0] == 'super':
            base = list(base_at(pos))
            # A non-mod file's module is its parent's child, as is a mod.rs's.
            while segs and segs[0] == 'super':
                base.pop(); segs = segs[1:]
            path = tuple(s for s in base if s != '<inline>') + tuple(segs)
        else:
            continue
        t = resolve(path)
        if t != mp and not (len(t) < len(mp) and mp[:len(t)] == t and t != () and path == t):
            targets.add(t)
    edges[mp] = targets

def name(mp):
    return files[mp]

def fold(mp):
    # Parts of a parent file (engine.rs + engine/tx.rs): the parent is a file, not a mod.rs.
    while len(mp) > 1 and mp[:-1] in files and not files[mp[:-1]].endswith(('mod.rs', 'lib.rs')):
        mp = mp[:-1]
    return mp

def top(mp):
    return mp[0] if mp else '(root)'

def graph(key):
    g = {}
    for a, ts in edges.items():
        for b in ts:
            ka, kb = key(a), key(b)
            g.setdefault(ka, set())
            g.setdefault(kb, set())
            if ka != kb and kb != '(root)' and kb != ():
                g[ka].add(kb)
    return g

def sccs(g):
    index, low, on, st, out, i = {}, {}, set(), [], [], [0]
    def visit(v):
        index[v] = low[v] = i[0]; i[0] += 1
        st.append(v); on.add(v)
        for w in sorted(g[v], key=str):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            out.append(comp)
    sys.setrecursionlimit(10000)
    for v in sorted(g, key=str):
        if v not in index:
            visit(v)
    return out

bad = False
for title, key, show in (('folders', top, str), ('files', fold, lambda m: files[m])):
    g = graph(key)
    print(f'== {title}: {len(g)} nodes, {sum(map(len, g.values()))} edges')
    for a in sorted(g, key=show):
        if g[a]:
            print(f'  {show(a)} -> {", ".join(sorted(map(show, g[a])))}')
    cyc = [c for c in sccs(g) if len(c) > 1]
    for c in cyc:
        print(f'  CYCLE: {" <-> ".join(sorted(map(show, c)))}')
    print(f'  {"no cycle" if not cyc else f"{len(cyc)} cycle(s)"}')
    bad |= bool(cyc)
sys.exit(1 if bad else 0)
EOF
