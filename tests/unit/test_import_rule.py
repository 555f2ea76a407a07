"""The import rule: trident's layers import downward only, and no two modules import each other.

Layers, lowest first (a module may import its own layer and the layers below it):

0. leaf: ``trident.errors``, ``trident.types``, ``trident.options``, ``trident.observability.logs``,
   ``trident.protocol.datatypes``, ``trident.native``, ``trident.trio_private``,
   ``trident.priority`` (they import only each other);
1. ``trident.protocol`` (sans-IO codecs: the wire, config text, HTTP/1.1 and HTTP/2 framing);
2. model config: ``trident.config``, ``trident.config_validation``;
3. observability records: ``trident.observability`` ``.stats``, ``.model_metrics``, ``.trace``,
   ``.tracing``;
4. ``trident.backends`` (the backend interface and the framework backends) and
   ``trident.agents`` (repository agents);
5. ``trident.batching`` (schedulers; they call backends through the backend interface);
6. the server core (``trident.server``: the server, the repository, model versions, execution,
   shared memory, worker threads), host metrics, listeners and the socket layer both front ends
   share (``trident.sockets_io``), the parts of ``--workers`` that
   serve no request (``trident.cluster``: CPUs, sockets, the control channel and its messages,
   merging);
7. front ends: ``trident.http``, ``trident.grpc``, ``trident.openai``, ``trident.perf``, the
   metrics endpoint (``trident.observability.metrics``), serve and its start-up checks, the CLI,
   the threaded wrapper (``trident.server.threaded``), Triton's in-process API
   (``trident.tritonserver``) and its front ends (``trident.tritonfrontend``), the ``--workers``
   supervisor, worker and link (they run servers).

Every import counts for the layers, at any depth of the module (lazy imports in functions and
``TYPE_CHECKING`` ones too): a dependency is a dependency. No import cycle, of any length, type-only
ones included (lazy imports too). ``import trident`` (the lazy package
namespace) is allowed everywhere. The rule is read from the source with ``ast``, so a new
module that no layer names fails the test until it is placed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"trident": "trident", "protocol": "trident.protocol", "backends": "trident.backends",
            "batching": "trident.batching", "agents": "trident.agents"}

LEAF = {"trident.errors", "trident.types", "trident.options", "trident.observability.logs",
        "trident.protocol.datatypes", "trident.native", "trident.trio_private", "trident.priority"}
# (layer, module prefixes): the longest matching prefix places a module
LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (0, (*LEAF, "trident.observability")),  # the package itself: a docstring
    (1, ("trident.protocol",)),
    (2, ("trident.config", "trident.config_validation")),
    (3, ("trident.observability.stats", "trident.observability.model_metrics", "trident.observability.trace",
         "trident.observability.tracing")),
    (4, ("trident.backends", "trident.agents")),
    (5, ("trident.batching",)),
    (6, ("trident.server", "trident.observability.host_metrics", "trident.restricted", "trident.listening",
         "trident.sockets_io", "trident.cluster")),
    (7, ("trident.http", "trident.grpc", "trident.openai", "trident.perf", "trident.observability.metrics",
         "trident.serve", "trident.startup", "trident.cli", "trident.__main__", "trident.server.threaded",
         "trident.cluster.supervisor", "trident.cluster.worker", "trident.cluster.link", "trident.tritonserver",
         "trident.tritonfrontend")),
]


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            if "generated" in rel.parts or "example_repository" in rel.parts:
                continue  # betterproto2 output; the bundled models (data, loaded by the Python backend)
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int | None:
    if module == "trident":
        return None
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return None if best is None else best[1]


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports_of(module: str, *, typing: bool = True) -> set[str]:
    """The trident modules ``module`` imports (``from pkg import name`` counts ``pkg.name`` when
    that is a module, else ``pkg``); without ``typing``, not those under ``if TYPE_CHECKING``."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if typing else _type_checking_blocks(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "trident")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "trident":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & MODULES.keys()
            found.update(subs or {target})
    found.discard(module)
    return {m if m in MODULES or m == "trident" else _owner(m) for m in found}


def _owner(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if m != "trident" and layer_of(m) is None)
    assert not unplaced, f"modules no layer names (place them in LAYERS): {unplaced}"


def test_imports_point_down() -> None:
    upward = []
    for module in sorted(MODULES):
        own = layer_of(module)
        if own is None:
            continue
        for target in sorted(imports_of(module)):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                upward.append(f"{module} (layer {own}) imports {target} (layer {theirs})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_leaf_imports_only_the_leaf() -> None:
    bad = [f"{m} imports {t}" for m in sorted(LEAF) for t in sorted(imports_of(m))
           if t != "trident" and t not in LEAF]
    assert not bad, bad


def test_protocol_is_sans_io() -> None:
    io = {"trio", "socket", "asyncio", "threading", "selectors"}
    bad = []
    for module, path in MODULES.items():
        if layer_of(module) != 1:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{module} imports {n}" for n in names if n.split(".")[0] in io]
    assert not bad, bad


def test_no_two_modules_import_each_other() -> None:
    # at run time: annotations may name a sibling's types (``if TYPE_CHECKING``), as a
    # protocol's implementation and its user do
    graph = {m: imports_of(m, typing=False) for m in MODULES}
    cycles = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                     if b in graph and a in graph[b] and a != b})
    assert not cycles, f"modules that import each other: {cycles}"


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of two modules or more
    (Tarjan's algorithm, without recursion), each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


#: type-only cycles known and left to their owners: the in-process API (trident.tritonserver,
#: written by another engineer as this rule grew) names its classes' types both ways under
#: ``if TYPE_CHECKING``; its modules import each other in one direction at run time
KNOWN_TYPE_ONLY_CYCLES = [
    ["trident.tritonserver._model", "trident.tritonserver._request", "trident.tritonserver._response",
     "trident.tritonserver._server"],
]


def test_no_import_cycle() -> None:
    # every import counts, those made for annotations only (``if TYPE_CHECKING``) included: a
    # type that one side needs of the other goes to a module both import, or becomes a
    # Protocol of what the user needs (trident.http.state, trident.grpc.call.CallHost)
    run_time = cycles_of({m: imports_of(m, typing=False) for m in MODULES})
    assert not run_time, "import cycles at run time:\n" + "\n".join(" <-> ".join(c) for c in run_time)
    cycles = [c for c in cycles_of({m: imports_of(m) for m in MODULES}) if c not in KNOWN_TYPE_ONLY_CYCLES]
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_long_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert cycles_of(graph) == [["a", "b", "c"], ["f", "g"]]
    assert cycles_of({"x": {"y"}, "y": set()}) == []


def test_the_rule_sees_imports() -> None:
    # the checker itself: a known downward import is found, and layers are ordered as documented
    assert "trident.errors" in imports_of("trident.protocol.kserve")
    assert "trident.backends" in imports_of("trident.server.model")
    assert layer_of("trident.protocol.datatypes") == 0 and layer_of("trident.protocol.kserve") == 1
    assert layer_of("trident.http.app") == 7 and layer_of("trident.batching.dynamic") == 5
