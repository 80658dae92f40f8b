"""Rules about the shape of quantkit/ that the architecture relies on (see docs/architecture.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "quantkit"
SOURCES = sorted(PACKAGE.rglob("*.py"))
MAX_PARAMS = 6
MAX_LINES = 60  # per function, outside cli/ (Typer commands list their options)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_cli_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A Typer command callback (each command-line option is a parameter by Typer's design):
    every parameter's default is a ``typer.Option``/``typer.Argument`` or a shared option (a
    ``**kwargs`` takes options generated from a registry, e.g. ``quantkit gate``'s thresholds)."""
    args = node.args
    defaults = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    if len(defaults) != len(_params(node)) - (args.kwarg is not None) or not defaults:
        return False

    def is_option(default: ast.expr) -> bool:
        call = default.func if isinstance(default, ast.Call) else default
        name = ast.unparse(call)
        return name.startswith("typer.") or name.endswith(("Option", "_option", "Argument"))

    return all(is_option(d) for d in defaults)


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    args = node.args
    out = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    out += [a for a in (args.vararg, args.kwarg) if a is not None]
    return [a for a in out if a.arg not in {"self", "cls"}]


def test_no_function_takes_more_than_six_parameters() -> None:
    offenders = []
    for path in SOURCES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_cli_command(node):
                count = len(_params(node))
                if count > MAX_PARAMS:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({count})")
    assert offenders == []


def test_the_shape_check_sees_a_long_signature(tmp_path: Path) -> None:
    """The rule above can fail: a seven-parameter function is counted as seven."""
    node = ast.parse("def f(self, a, b, c, *, d, e, f, g=1): pass").body[0]
    assert isinstance(node, ast.FunctionDef)
    assert len(_params(node)) == 7


def _long_functions(tree: ast.Module) -> list[tuple[str, int, int]]:
    return [
        (node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_LINES
    ]


def test_no_function_outside_the_cli_is_longer_than_sixty_lines() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in SOURCES
        if "cli" not in path.relative_to(PACKAGE).parts
        for name, line, length in _long_functions(_tree(path))
    ]
    assert offenders == []


def test_the_length_check_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert _long_functions(ast.parse(f"def f():\n{body}\n")) == [("f", 1, MAX_LINES + 1)]


def _annotations(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    out = [a.annotation for a in _params(node) if a.annotation is not None]
    return out + ([node.returns] if node.returns is not None else [])


@pytest.mark.parametrize("folder", ["stages", "runtimes", "backends"])
def test_no_any_in_stage_runtime_or_backend_signatures(folder: str) -> None:
    offenders = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for note in _annotations(node):
                    if re.search(r"\bAny\b", ast.unparse(note)):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert offenders == []


def _imports(path: Path) -> set[str]:
    """quantkit modules that ``path`` imports anywhere: at module level, in ``TYPE_CHECKING``
    blocks and inside functions (an import deferred for start-up time still couples the
    modules)."""
    tree, here = _tree(path), _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for stmt in (node for top in body for node in ast.walk(top)):
            if isinstance(stmt, ast.Import):
                found.update(a.name for a in stmt.names if a.name.startswith("quantkit"))
            elif isinstance(stmt, ast.ImportFrom):
                base = stmt.module or ""
                if stmt.level:
                    anchor = package.split(".")[: len(package.split(".")) - stmt.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                if base.startswith("quantkit"):
                    found.add(base)
                    found.update(f"{base}.{a.name}" for a in stmt.names)

    visit(tree.body)
    return found


def test_no_import_cycles_between_modules() -> None:
    modules = {_module_name(p): p for p in SOURCES}
    graph = {
        name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    # A package's __init__ importing its own submodules (the registries) is not a cycle of design.
    real = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert [" -> ".join(c) for c in real] == []


def test_the_cycle_check_sees_imports_inside_functions() -> None:
    """Negative control: llama.cpp's runtime imports the lm-eval adapter only inside
    ``lm_eval_model``; the graph the cycle check walks has that edge."""
    path = ROOT / "quantkit" / "runtimes" / "llamacpp.py"
    assert "from quantkit.evals.lm_eval_runtime import RuntimeLM" in path.read_text()
    assert "quantkit.evals.lm_eval_runtime" in _imports(path)


def test_install_hints_name_extras_that_exist() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(meta["project"]["optional-dependencies"])
    named = {
        (str(path.relative_to(ROOT)), extra)
        for path in SOURCES
        for group in re.findall(r"quantkit\[([a-z0-9_,\- ]+)\]", path.read_text(encoding="utf-8"))
        for extra in group.split(",")
    }
    assert named, "no install hints found: the pattern is wrong"
    assert sorted((where, e) for where, e in named if e.strip() not in extras) == []


def test_a_missing_extra_fails_the_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import require_extra

    monkeypatch.delenv("QUANTKIT_ALLOW_MISSING_EXTRAS", raising=False)
    with pytest.raises(pytest.fail.Exception, match="install quantkit\\[gguf\\]"):
        require_extra("quantkit_no_such_module", "gguf")
    monkeypatch.setenv("QUANTKIT_ALLOW_MISSING_EXTRAS", "1")
    with pytest.raises(pytest.skip.Exception):
        require_extra("quantkit_no_such_module", "gguf")


def test_the_top_of_the_package_holds_only_what_everything_uses() -> None:
    """At most 8 modules directly under quantkit/: the package face, ``__main__`` and the few
    modules every layer imports; the rest live in packages named after their part."""
    top = sorted(path.name for path in (ROOT / "quantkit").glob("*.py"))
    assert top == [
        "__init__.py",
        "__main__.py",
        "device.py",
        "errors.py",
        "jsontypes.py",
        "paths.py",
        "registry.py",
    ]
