"""armllm's import graph, read from the source with `ast` (imports inside
functions and under `if TYPE_CHECKING:` count): no cycle among armllm's
modules, no import from a lower layer to a higher one (DESIGN.md's layers),
and only ops.py imports the C kernels."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# DESIGN.md's layers, highest first; a module may import its own layer and those below.
# A name stands for a module and, if it is a package, everything inside it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("armllm.cli", "armllm.__main__", "armllm.generate_cli", "armllm.transcribe_cli",
             "armllm.bench")),
    ("server", ("armllm.server", "armllm.ray")),
    ("api", ("armllm.api", "armllm")),  # the package's __init__ re-exports api's names
    ("engine", ("armllm.engine", "armllm.sampling", "armllm.structured_output",
                "armllm.audio")),  # audio: Whisper's decoding over SamplingParams
    ("model", ("armllm.model",)),
    ("ops", ("armllm.ops",)),
    ("_kernels", ("armllm._kernels",)),
    # leaves, importing nothing of armllm above them, so that every layer may use them
    ("leaves", ("armllm._blas_threads", "armllm.cmdline", "armllm.demo_model")),
]
RANK = {prefix: len(LAYERS) - i for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}
LAYER_NAME = {prefix: name for name, prefixes in LAYERS for prefix in prefixes}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    """Every armllm module: Python files, and Cython extensions (no Python imports)."""
    return {module_name(p): p for pattern in ("*.py", "*.pyx")
            for p in (SRC / "armllm").rglob(pattern)}


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The armllm modules `source` (of `module`) imports, wherever the import
    statement stands. `from package import name` is the module package.name when
    that is a module, else the package."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # armllm.x.y.attr -> armllm.x.y
                name = name.rpartition(".")[0]
            if name.split(".")[0] == "armllm" and name:
                found.add(name)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {name: imports_of(path.read_text(), name, path.name == "__init__.py", known)
            if path.suffix == ".py" else set() for name, path in modules.items()}


def layer_of(module: str) -> str | None:
    """The LAYERS entry that names this module most closely."""
    best = None
    for prefix in RANK:
        if (module == prefix or (module.startswith(prefix + ".") and prefix != "armllm")) \
                and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_reader_counts_imports_inside_functions_and_relative_ones():
    known = {"armllm", "armllm.api", "armllm.ops", "armllm.model", "armllm.model.decoder",
             "armllm.model.config"}
    source = ("import numpy\n"
              "from armllm import ops\n"
              "from . import config\n"
              "def f():\n"
              "    from armllm.api import LLM\n"
              "    class C:\n"
              "        import armllm.model.decoder.x\n")
    assert imports_of(source, "armllm.model.loader", False, known) == {
        "armllm.ops", "armllm.model.config", "armllm.api", "armllm.model.decoder"}


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in all_modules() if layer_of(m) is None)
    assert not unplaced, f"place these modules in a layer of LAYERS: {unplaced}"


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, f"import cycles: {found}"


def test_imports_point_down_the_layers():
    upward = []
    for module, targets in sorted(import_graph().items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here and there and RANK[there] > RANK[here]:
                upward.append(f"{module} ({LAYER_NAME[here]}) imports {target} "
                              f"({LAYER_NAME[there]})")
    assert not upward, "\n".join(upward)


def test_only_ops_imports_the_kernels():
    importers = sorted(m for m, targets in import_graph().items()
                       if layer_of(m) != "armllm._kernels"
                       and any(layer_of(t) == "armllm._kernels" for t in targets))
    assert importers == ["armllm.ops"]


def test_only_armllm_ray_imports_ray():
    """Ray is an optional extra (armllm[ray]): armllm.ray alone imports it (and only
    `armllm serve --ray` imports armllm.ray), so that `import armllm` and `armllm serve`
    neither need nor load Ray."""
    def imports_ray(source: str) -> bool:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] == "ray" for name in names):
                return True
        return False

    importers = sorted(m for m, path in all_modules().items()
                       if path.suffix == ".py" and imports_ray(path.read_text()))
    assert importers == ["armllm.ray"]
