"""pyproject.toml declares what the code imports: every third-party package
armllm imports is a dependency of `pip install armllm` (unless the import
is guarded by an ImportError handler with its own message), and every package
a test needs (pytest.importorskip) is in the [test] extra, so that CI never
skips a test for want of it."""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    return {_normal(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distribution(module: str) -> str:
    """The distribution that installs a top-level module (as installed here; else
    the module's own name)."""
    owners = _installed().get(module)
    return _normal(owners[0]) if owners else _normal(module)


class _Imports(ast.NodeVisitor):
    """Top-level names of absolute imports, except those in a `try` that handles
    ImportError (an optional package with its own error message)."""

    def __init__(self):
        self.found: set[str] = set()
        self.guarded = 0

    def visit_Try(self, node: ast.Try) -> None:
        handles = any(_catches_import_error(h.type) for h in node.handlers)
        self.guarded += handles
        for stmt in node.body:
            self.visit(stmt)
        self.guarded -= handles
        for stmt in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        if not self.guarded:
            self.found.update(alias.name.split(".")[0] for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not self.guarded and not node.level:
            self.found.add(node.module.split(".")[0])


def _catches_import_error(handler_type) -> bool:
    names = [handler_type] if not isinstance(handler_type, ast.Tuple) else handler_type.elts
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
               for n in names)


def third_party_imports(source: str) -> set[str]:
    visitor = _Imports()
    visitor.visit(ast.parse(source))
    return {m for m in visitor.found
            if m not in sys.stdlib_module_names and m not in ("armllm", "__future__")}


def test_the_reader_skips_guarded_imports():
    source = ("import numpy\nfrom os import path\n"
              "def f():\n    import httpx\n"
              "try:\n    import matplotlib\nexcept ImportError:\n    pass\n"
              "try:\n    import yaml\nexcept KeyError:\n    pass\n")
    assert third_party_imports(source) == {"numpy", "httpx", "yaml"}


def test_every_package_armllm_imports_is_a_dependency():
    declared = _requirement_names(PROJECT["dependencies"])
    missing = {}
    for path in sorted((ROOT / "src" / "armllm").rglob("*.py")):
        for module in third_party_imports(path.read_text()):
            if _distribution(module) not in declared:
                missing.setdefault(_distribution(module), []).append(
                    str(path.relative_to(ROOT)))
    assert not missing, f"imported but not in [project.dependencies]: {missing}"


def _importorskip_modules(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "importorskip" and node.args
                and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value.split(".")[0])
    return found


def test_every_package_a_test_may_skip_without_is_in_the_test_extra():
    extra = _requirement_names(PROJECT["optional-dependencies"]["test"])
    missing = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for module in _importorskip_modules(path.read_text()):
            if _distribution(module) not in extra:
                missing.setdefault(_distribution(module), []).append(
                    str(path.relative_to(ROOT)))
    assert not missing, f"tests skip without these, absent from the [test] extra: {missing}"
