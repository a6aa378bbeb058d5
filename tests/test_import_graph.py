"""Our modules form no import cycle, and no module reaches into another's private names.

Read with ``ast`` (nothing is imported): every ``import`` counts, at module level, inside a
function (a lazy import is still a cycle, only one that waits for its first call) or under
``if TYPE_CHECKING:`` (a type-only import is still a dependency in the other direction). A
cycle is a strongly connected set of modules. A private name (``_x``, not a dunder) of one of our modules may not be imported by
another (``from core.capsules.jobs import _x``), nor reached through it (``jobs._x(...)``,
``runner._x(...)`` when ``_x`` is defined in another module and not in the reader's own).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("core", "console", "bench")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not MODULES[module].name == "__init__.py":
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import ``module`` runs."""
    tree = ast.parse(MODULES[module].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, node)
            for a in node.names:
                if f"{src}.{a.name}" in MODULES:
                    out.append((f"{src}.{a.name}", [], node.lineno))
                else:
                    out.append((src, [a.name], node.lineno))
    return out


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for mod in MODULES:
        graph[mod]
        for target, _, _ in imports_of(mod):
            if target in MODULES and target != mod:
                graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected sets of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        comp.add(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(comp)
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, assignments, attributes."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return {n for n in out if _private(n)}


def private_reaches() -> list[tuple[str, int, str, str]]:
    """(reader file, line, private name, how) for every reach into another module's privates."""
    trees = {m: ast.parse(p.read_text()) for m, p in MODULES.items()}
    defined = {m: _defined_privates(t) for m, t in trees.items()}
    everywhere = set().union(*defined.values())
    found = []
    for mod, tree in trees.items():
        rel = MODULES[mod].relative_to(ROOT).as_posix()
        module_aliases: dict[str, str] = {}
        for target, names, line in imports_of(mod):
            if target not in MODULES:
                continue
            for n in names:
                if _private(n):
                    found.append((rel, line, n, f"from {target} import {n}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in MODULES:
                        module_aliases[a.asname or a.name.split(".")[0]] = a.name
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(mod, node)
                for a in node.names:
                    if f"{src}.{a.name}" in MODULES:
                        module_aliases[a.asname or a.name] = f"{src}.{a.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                continue
            if isinstance(owner, ast.Name) and owner.id in module_aliases:
                target = module_aliases[owner.id]
                if target != mod and node.attr in defined[target]:
                    found.append((rel, node.lineno, node.attr, f"{owner.id}.{node.attr}"))
            elif node.attr in everywhere and node.attr not in defined[mod]:
                found.append((rel, node.lineno, node.attr, ast.unparse(node)))
    return found


def test_no_import_cycle():
    found = [sorted(c) for c in cycles(import_graph())]
    assert not found, "import cycles (a lazy import counts too):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_no_private_name_across_modules():
    found = private_reaches()
    assert not found, "private names used across modules:\n" + "\n".join(
        f"{rel}:{line}: {how}" for rel, line, _, how in found)


def test_the_checks_catch_what_they_claim(tmp_path):
    """The cycle finder sees a cycle closed by a lazy import; the private check sees both
    forms (the checks above cannot pass vacuously)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
    lazy = ast.parse("def f():\n    from core import jobs\n    return jobs._cmd_script()\n")
    calls = [n for n in ast.walk(lazy) if isinstance(n, ast.Attribute) and _private(n.attr)]
    assert [ast.unparse(c) for c in calls] == ["jobs._cmd_script"]
    assert "_x" in _defined_privates(ast.parse("class A:\n    def _x(self): pass\n"))


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_runner_imports_nothing_of_tau_over_training():
    """Tau over training lives in the train action's room (core.actions.watch_eval) and is
    reached through its hooks; the runner only calls hooks (a lazy import counts too)."""
    found = [(t, line) for t, _, line in imports_of("core.runs.runner")
             if _under(t, "core.actions.watch_eval")]
    assert not found, f"core/runs/runner.py imports tau over training: {found}"


def test_no_action_imports_the_runner_or_the_session():
    """Actions see an ActionContext, never the runner or the session above them."""
    found = [f"{MODULES[m].relative_to(ROOT).as_posix()}:{line}: {t}"
             for m in MODULES if _under(m, "core.actions")
             for t, _, line in imports_of(m)
             if _under(t, "core.runs.runner") or _under(t, "core.session")]
    assert not found, "actions importing upward:\n" + "\n".join(found)


def untyped_runner_params(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, function) of every function taking a parameter ``runner`` without a type."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.arg == "runner" and arg.annotation is None:
                    out.append((node.lineno, getattr(node, "name", "lambda")))
    return out


def test_no_function_in_core_takes_an_untyped_runner():
    """A function handed the whole runner says so in its signature (the call graph cannot
    loop back through an untyped parameter unseen)."""
    found = [f"{MODULES[m].relative_to(ROOT).as_posix()}:{line}: {name}"
             for m in MODULES if _under(m, "core")
             for line, name in untyped_runner_params(ast.parse(MODULES[m].read_text()))]
    assert not found, "untyped runner parameters:\n" + "\n".join(found)


def test_the_new_checks_catch_what_they_claim():
    tree = ast.parse("def f(runner, x): pass\nasync def g(*, runner: 'Runner'): pass\n"
                     "h = lambda runner: runner\n")
    assert untyped_runner_params(tree) == [(1, "f"), (3, "lambda")]
    assert _under("core.actions.watch_eval.detached", "core.actions.watch_eval")
    assert not _under("core.actions.watch_evaluation", "core.actions.watch_eval")


def test_core_ml_imports_only_the_leaf_modules_of_core():
    """What runs on a host (``python -m core.ml.<task>``) reaches into the rest of ``core`` only
    for core.errors and core.text, which import nothing but the standard library."""
    import ast

    root = Path(__file__).resolve().parent.parent
    leaves = {"core.errors", "core.text", "core.moved"}
    found = set()
    for path in (root / "core" / "ml").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "core" and node.level == 0:
                names = [f"core.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {n for n in names if n.startswith("core.") and not n.startswith("core.ml")}
    assert found <= leaves, found - leaves
    for leaf in leaves:
        tree = ast.parse((root / (leaf.replace(".", "/") + ".py")).read_text())
        assert {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.startswith("core")} <= leaves, leaf


# The wings (README's layout section): a module may import its own wing and the wings ranked
# below it, never one above. Each rank is a set of wings that do not import each other.
CORE_WINGS = [
    {"core", "core.errors", "core.text", "core.faults", "core.versions", "core.moved",
     "core.selfwheel"},
    {"core.ml"},
    {"core.state", "core.hosts"},
    {"core.capsules", "core.tau"},
    {"core.plans"},
    {"core.actions"},
    {"core.runs"},
    {"core.session"},
    {"core.demo"},
    {"console"},
    {"bench"},
]
ML_WINGS = [
    {"core.ml.formats"},
    {"core.ml.measure", "core.ml.models"},
    {"core.ml.decoding"},
    {"core.ml.engines", "core.ml.demo"},
    {"core.ml.tasks"},
    {"core.ml.train"},
    {"core.ml"},  # the thin entries ``python -m core.ml.<task>`` runs
]
WING_EXCEPTIONS = {
    # A plan file is checked against the action kinds' parameters as a whole (file:line for
    # every problem), so the reader of plan files looks the kinds up; the plan model does not.
    ("core.plans.planfile", "core.actions.registry"),
}


def _wing(module: str, ranks: list[set[str]]) -> tuple[str, int] | None:
    best = None
    for rank, wings in enumerate(ranks):
        for w in wings:
            if (module == w if (ranks is CORE_WINGS and rank == 0) else _under(module, w)) and (best is None or len(w) > len(best[0])):
                best = (w, rank)
    return best


def _wing_violations(ranks, scope) -> list[str]:
    bad = []
    for mod, targets in import_graph().items():
        if not _under(mod, scope):
            continue
        here = _wing(mod, ranks)
        for t in targets:
            there = _wing(t, ranks)
            if here is None or there is None or here[0] == there[0] or (ranks is CORE_WINGS and here[1] == there[1] == 0):
                continue
            if there[1] >= here[1] and (mod, t) not in WING_EXCEPTIONS:
                bad.append(f"{mod} ({here[0]}) imports {t} ({there[0]})")
    return bad


def test_core_wings_point_one_way():
    """Every module belongs to a wing; no wing imports one ranked above it (or beside it)."""
    unplaced = [m for m in MODULES if _wing(m, CORE_WINGS) is None]
    assert not unplaced, f"modules in no wing (add them to CORE_WINGS and README's map): {unplaced}"
    assert not _wing_violations(CORE_WINGS, "core") + _wing_violations(CORE_WINGS, "console"), \
        _wing_violations(CORE_WINGS, "core") + _wing_violations(CORE_WINGS, "console")


def test_ml_wings_point_one_way():
    assert not _wing_violations(ML_WINGS, "core.ml"), _wing_violations(ML_WINGS, "core.ml")


def test_the_wing_checks_can_fail():
    """The rank test sees an import that climbs: a store importing the runner would be named."""
    assert _wing("core.state.store", CORE_WINGS) == ("core.state", 2)
    assert _wing("core.runs.runner", CORE_WINGS)[1] > _wing("core.state.store", CORE_WINGS)[1]
    assert _wing("core.ml.formats.runio", ML_WINGS)[1] < _wing("core.ml.tasks.eval", ML_WINGS)[1]
    assert _wing("core.ml.eval", ML_WINGS) == ("core.ml", len(ML_WINGS) - 1)


def test_no_folder_of_core_holds_more_than_15_modules():
    root = Path(__file__).resolve().parent.parent / "core"
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"]]:
        mods = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(mods) <= 15, f"{folder}: {len(mods)} modules at one level; give it wings"
