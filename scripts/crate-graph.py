#!/usr/bin/env python3
"""The workspace's crate graph, drawn from `cargo metadata` (normal dependencies only).

Prints one line per workspace crate, in layer order (a crate after everything it depends
on): `crate -> dep, dep` listing its normal (non-dev, non-build) dependencies on other
workspace crates. Then checks the layering rules of docs/ARCHITECTURE.md ("Layers and
crates"): no crate depends (normally) on a test crate (netns-tests, testkit); netlab and
the wire crates depend on nothing of ours; rdma-cm does not depend on softiwarp; bench
does not depend on netns-tests; the graph has no cycle.

Usage: scripts/crate-graph.py            print the graph, exit 1 if a rule is broken
       scripts/crate-graph.py --check F  also exit 1 unless file F holds the printed graph
                                         between the lines `<!-- crate-graph -->` and
                                         `<!-- /crate-graph -->` (inside a code block)
"""
import json
import subprocess
import sys

meta = json.loads(subprocess.check_output(
    ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"]))
names = {p["name"] for p in meta["packages"]}
deps = {}
for p in meta["packages"]:
    deps[p["name"]] = sorted({d["name"] for d in p["dependencies"]
                              if d["name"] in names and d.get("kind") is None})

# Layer order: repeatedly take the crates whose dependencies are all placed.
order, placed = [], set()
while len(placed) < len(deps):
    ready = sorted(n for n in deps if n not in placed and set(deps[n]) <= placed)
    if not ready:
        print("error: dependency cycle among", sorted(set(deps) - placed), file=sys.stderr)
        sys.exit(1)
    order += ready
    placed |= set(ready)

lines = [f"{n} -> {', '.join(deps[n]) if deps[n] else '(nothing of ours)'}" for n in order]
print("\n".join(lines))

errors = []
for n, ds in deps.items():
    for t in ("netns-tests", "testkit"):
        if t in ds:
            errors.append(f"{n} has a normal dependency on the test crate {t}")
for leaf in ("netlab", "mpa", "ddp-rdmap", "verbs"):
    if deps.get(leaf):
        errors.append(f"{leaf} must depend on nothing of ours, depends on {deps[leaf]}")
if "softiwarp" in deps.get("rdma-cm", []):
    errors.append("rdma-cm depends on softiwarp (the device plugs in from softiwarp/src/cm)")
if "netns-tests" in deps.get("bench", []):
    errors.append("bench depends on netns-tests")
if len(sys.argv) == 3 and sys.argv[1] == "--check":
    text = open(sys.argv[2]).read()
    try:
        block = text.split("<!-- crate-graph -->", 1)[1].split("<!-- /crate-graph -->", 1)[0]
    except IndexError:
        block = ""
    body = [l for l in block.strip().splitlines() if not l.startswith("```")]
    if body != lines:
        errors.append(f"{sys.argv[2]}'s crate graph differs from cargo metadata; "
                      "paste the lines printed above between its crate-graph markers")
for e in errors:
    print("error:", e, file=sys.stderr)
sys.exit(1 if errors else 0)
