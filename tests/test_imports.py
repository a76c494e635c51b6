"""The package's import contracts (docs/architecture.md): no import circle anywhere, verification rules free
of models and engine, the library core free of the tools and entry points. grimp reads every import of every
module, those inside functions included (not those for type annotations alone)."""

import grimp
import pytest

# the tools and entry points: they may use the core, never the other way round
TOOLS = (
    "multispec.tools",
    "multispec.entrypoints",
    "multispec.__main__",
)
# the library core: what `generate()` and `load_pair()` need
CORE = (
    "multispec.api",
    "multispec.batching",
    "multispec.lockstep",
    "multispec.batchload",
    "multispec.result",
    "multispec.engine",
    "multispec.decoding",
    "multispec.drafting",
    "multispec.verify",
    "multispec.models",
    "multispec.trees",
    "multispec.warp",
    "multispec.params",
    "multispec.machine",
    "multispec.streaming",
    "multispec.likelihood",
    "multispec.tree_search",
    "multispec.console",
)
# what a verification rule may import: probability vectors, draws and trees, nothing that holds a model
VERIFY_MAY_IMPORT = ("multispec.verify", "multispec.warp", "multispec.trees")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.fixture(scope="module")
def graph():
    # imports for type annotations only (under `TYPE_CHECKING`: a part naming the model it belongs to) never run
    return grimp.build_graph("multispec", exclude_type_checking_imports=True)


def import_cycles(graph) -> list[list[str]]:
    """The strongly connected sets of modules (more than one module) of the direct-import graph."""
    order, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(start):  # Tarjan's algorithm, iteratively (the graph is deep enough for Python's recursion limit)
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in order:
                    order[nxt] = low[nxt] = len(order)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], order[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    members = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        members.append(m)
                        if m == node:
                            break
                    if len(members) > 1:
                        cycles.append(sorted(members))

    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    return cycles


def test_no_import_circle(graph):
    assert import_cycles(graph) == []


def test_verification_rules_import_no_model_engine_or_method(graph):
    for module in graph.modules:
        if _under(module, ("multispec.verify",)):
            for imported in graph.find_modules_directly_imported_by(module):
                if imported.startswith("multispec"):
                    assert _under(imported, VERIFY_MAY_IMPORT), f"{module} imports {imported}"


def test_the_core_imports_no_tool(graph):
    for module in graph.modules:
        if _under(module, CORE):
            for imported in graph.find_modules_directly_imported_by(module):
                assert not _under(imported, TOOLS) and imported != "multispec", f"{module} imports {imported}"


def test_every_module_is_core_or_tool(graph):
    # a new module is placed on purpose: add it to CORE or TOOLS (docs/architecture.md says which is which)
    placed = CORE + TOOLS + ("multispec.data",)
    assert sorted(m for m in graph.modules if m != "multispec" and not _under(m, placed)) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert import_cycles(graph) == [["p.a", "p.b", "p.c"]]
