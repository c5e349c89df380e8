"""Rewrite imports of the operator's pure modules to their homes under `core` (issue #31).

    python3 hack/rewrite_operator_imports.py [FILE...]   (default: every tracked *.py)

The modules moved in one commit; a branch written before it still imports
`gpuplan_operator.resources`, `gpuplan_operator.inventory`, `gpuplan_operator.extender.plans`
and the like. Run this after merging such a branch: it rewrites those imports (and dotted
mentions) to `gpuplan_operator.core.*` / `gpuplan_operator.extender.core.*`, renames the two
inventories (`core.gpu_pools`, `extender.core.snapshot`) where they are used as modules, and
leaves every other line alone; running it twice changes nothing. Sort the imports afterwards
with `ruff check --fix --select I`.
"""
import ast
import pathlib
import re
import subprocess
import sys

OP = "gpuplan_operator"
OP_CORE = ["annotations", "errors", "gpu_accounting", "kueue", "manifests", "resources",
           "settings", "validation", "benchmarks", "tracking", "coalescing", "retraining"]
EXT_CORE = ["protocol", "plans", "scoring", "store"]
# old dotted module -> new dotted module
MOVES = {f"{OP}.{m}": f"{OP}.core.{m}" for m in OP_CORE}
MOVES[f"{OP}.inventory"] = f"{OP}.core.gpu_pools"
MOVES.update({f"{OP}.extender.{m}": f"{OP}.extender.core.{m}" for m in EXT_CORE})
MOVES[f"{OP}.extender.inventory"] = f"{OP}.extender.core.snapshot"
POOL_NAMES = ["ClusterGpuPool", "Capacity", "build_inventory", "capacity", "gpu_requests_by_node"]
SNAP_NAMES = ["NodeGpus", "PodUsage", "NodeIndex", "Snapshot", "index_nodes", "make_snapshot",
              "node_gpus", "pod_key", "pod_usage", "used_by_node", "build_snapshot"]


def rewrite(path: pathlib.Path) -> bool:
    src = path.read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    edits = []  # (start, end, text)
    renamed_alias = {}  # local name -> new local name (for inventory module)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith(OP):
            indent = lines[node.lineno - 1][:node.col_offset]
            mod = node.module
            groups: dict[str, list[str]] = {}
            changed = False
            if mod in MOVES:
                groups.setdefault(MOVES[mod], []).extend(
                    a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
                changed = True
            else:
                for a in node.names:
                    full = f"{mod}.{a.name}"
                    if full in MOVES:
                        new_full = MOVES[full]
                        new_mod, new_name = new_full.rsplit(".", 1)
                        local = a.asname or a.name
                        if new_name != a.name and not a.asname:
                            renamed_alias[local] = new_name
                            local = new_name
                        text = new_name + (f" as {local}" if local != new_name else "")
                        groups.setdefault(new_mod, []).append(text)
                        changed = True
                    else:
                        groups.setdefault(mod, []).append(
                            a.name + (f" as {a.asname}" if a.asname else ""))
            if changed:
                text = "".join(f"{indent if i else ''}from {m} import {', '.join(sorted(ns))}\n"
                               for i, (m, ns) in enumerate(groups.items()))
                edits.append((node.lineno, node.end_lineno, node.col_offset, text))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MOVES:
                    sys.exit(f"plain import of a moved module in {path}:{node.lineno}")
    if not edits and not any(old in src for old in MOVES):
        return False
    for start, end, col, text in sorted(edits, reverse=True):
        prefix = lines[start - 1][:col]
        lines[start - 1:end] = [prefix + text]
    out = "".join(lines)
    for old_local, new_local in renamed_alias.items():
        names = POOL_NAMES if new_local == "gpu_pools" else SNAP_NAMES
        out = re.sub(rf"\b{old_local}\.({'|'.join(names)})\b", rf"{new_local}.\1", out)
    # dotted strings (docs in docstrings, subprocess -m, contracts)
    for old, new in sorted(MOVES.items(), key=lambda kv: -len(kv[0])):
        out = re.sub(rf"\b{re.escape(old)}\b(?!\.core)", new, out)
    if out != src:
        path.write_text(out)
        return True
    return False


def main() -> None:
    files = sys.argv[1:] or subprocess.run(["git", "ls-files", "*.py"], capture_output=True,
                                           text=True, check=True).stdout.split()
    for f in files:
        if rewrite(pathlib.Path(f)):
            print("rewrote", f)


if __name__ == "__main__":
    main()
