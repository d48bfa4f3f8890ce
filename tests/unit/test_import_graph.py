"""House rule: no import circles among vllm_hpu's modules.

The graph is read from the source (every ``import`` / ``from ... import``
statement, at module level, inside functions and under ``TYPE_CHECKING``
alike), so a circle that only a lazy or type-only import hides still counts:
it is a circle in the design, one refactor away from an ImportError.
"""

import ast
import pathlib
from collections.abc import Collection

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "vllm_hpu"


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from ... import`` statement reads from."""
    if not node.level:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - node.level + 1]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _imported(
    node: ast.AST, module: str, is_package: bool, modules: Collection[str]
) -> list[str]:
    """The modules an import statement names: ``from pkg import mod`` is an
    edge to ``pkg.mod``; ``from mod import name`` to ``mod``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = _absolute(node, module, is_package)
    submodules = [f"{base}.{alias.name}" for alias in node.names]
    return [name if name in modules else base for name in submodules]


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """Module -> the vllm_hpu modules it imports, anywhere in its source."""
    paths = sorted((root / PACKAGE).rglob("*.py"))
    modules = {module_name(path, root): path for path in paths}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        names = {
            name
            for node in ast.walk(tree)
            for name in _imported(node, module, is_package, modules)
        }
        graph[module] = {name for name in names if name in modules} - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph[module]):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done:
                found = visit(target)
                if found:
                    return found
        on_path.discard(path.pop())
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done:
            found = visit(module)
            if found:
                return found
    return None


def test_import_graph_has_no_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_import_graph_sees_lazy_and_type_only_imports(tmp_path):
    """The detector itself: a circle closed only by a function-level import
    and a TYPE_CHECKING import is found."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from vllm_hpu import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n"
    )
    (package / "c.py").write_text("import vllm_hpu.a\n")
    graph = import_graph(tmp_path)
    assert graph["vllm_hpu.c"] == {"vllm_hpu.a"}
    assert find_cycle(graph) == ["vllm_hpu.a", "vllm_hpu.b", "vllm_hpu.a"]


@pytest.mark.parametrize("module", ["vllm_hpu.worker.model_runner"])
def test_import_graph_reaches_the_runner(module):
    """The graph is not vacuous: the runner imports other vllm_hpu modules."""
    assert import_graph()[module]


def _importers(graph: dict[str, set[str]], prefix: str, target: str) -> list[str]:
    return sorted(
        module
        for module, targets in graph.items()
        if module.startswith(prefix) and any(t.startswith(target) for t in targets)
    )


def test_import_graph_runner_parts_never_import_the_runner():
    """Planning, state, capabilities and speculative decoding are the runner's
    parts: they see it through arguments and ``spec_decode.interface``."""
    graph = import_graph()
    runner = "vllm_hpu.worker.model_runner"
    for part in ("passes", "state", "capabilities", "spec_decode", "diagnostics"):
        assert _importers(graph, f"vllm_hpu.worker.{part}", runner) == []


def test_import_graph_attention_metadata_builders_never_call_back():
    """Planning calls the attention metadata builders, one way."""
    assert _importers(import_graph(), "vllm_hpu.attention", "vllm_hpu.worker") == []


# The package's rooms, lowest first: a module imports only from its own room and
# the rooms before it (docs/architecture.md draws this order). A module belongs to
# the longest room its name starts with; the entry points come last, and nothing
# in the package imports them.
ROOMS = (
    "compat",  # which vLLM runs: imports nothing of the plugin's
    "env_values",  # the parsers of envs.py's table
    "envs",
    "emulation",
    "device",
    "ops",
    "quantization",
    "distributed",
    "kv_transfer",
    "attention",
    "bucketing",
    "worker.passes",
    "worker.state",
    "worker.compilation",
    "worker.diagnostics",
    "worker.spec_decode",
    "worker.capabilities",
    "worker",  # the model runner, its KV caches and its sampling
    "worker.warmup",  # drives the runner through every bucket
    "worker.hpu_worker",
    "patches",
    "config",
)
ENTRY_POINTS = ("platform", "calibrate", "selfcheck")


def room_of(module: str) -> int:
    """The room's place in ``ROOMS``; entry points (the package itself, commands,
    ``__main__`` modules) share one place after every room."""
    name = module.removeprefix(PACKAGE).removeprefix(".")
    if not name or name in ENTRY_POINTS or name.endswith("__main__"):
        return len(ROOMS)
    rooms = [room for room in ROOMS if name == room or name.startswith(room + ".")]
    assert rooms, f"{module} is in no room: add its folder to ROOMS"
    return ROOMS.index(max(rooms, key=len))


def backward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a later room, or of an entry point, as 'a -> b'."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if room_of(target) > room_of(module) or room_of(target) == len(ROOMS)
    )


def test_rooms_import_one_way():
    assert backward_imports(import_graph()) == []


def test_rooms_detector_sees_a_backward_import(tmp_path):
    """The detector itself: ops importing the worker is a backward import."""
    package = tmp_path / PACKAGE
    (package / "ops").mkdir(parents=True)
    (package / "worker").mkdir()
    for path in (package, package / "ops", package / "worker"):
        (path / "__init__.py").write_text("")
    (package / "ops" / "a.py").write_text("from vllm_hpu.worker import b\n")
    (package / "worker" / "b.py").write_text("import vllm_hpu.ops.a\n")
    graph = import_graph(tmp_path)
    assert backward_imports(graph) == ["vllm_hpu.ops.a -> vllm_hpu.worker.b"]


def test_module_names_are_unique():
    """One name, one concept: no two modules share a file name."""
    names = [
        path.name
        for path in (ROOT / PACKAGE).rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    ]
    assert sorted({n for n in names if names.count(n) > 1}) == []
