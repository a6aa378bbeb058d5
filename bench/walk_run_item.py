"""A static walk of ``Runner.run_item``: which files it enters, and how often it climbs back.

Read with ``ast`` only (nothing of the walked code is imported, so any checkout can be walked,
an older commit's included). From ``core.runs.runner.Runner.run_item`` the walk follows every
call it can resolve inside the project's packages (``core``, ``console``), depth first, each
function visited once (its first visit), to ``--depth`` calls deep:

- ``self.f()`` / ``cls.f()``: a method of the enclosing class (or of a base class the walk can
  name);
- ``f()`` / ``mod.f()`` / ``Class()``: a function, or a class's ``__init__``, of the same module
  or of one it imports (``import a.b as m``, ``from a import b``, lazy imports included);
- with ``--typed`` only, also ``x.f()`` where ``x`` has a project class the walk can tell:
  ``self.attr`` assigned from an annotated parameter, an annotated attribute or a constructor
  call (``self.store.f()``: the Store); a parameter annotated with a class; a local assigned
  from a constructor.

Without ``--typed`` (the issue's rules) the store's methods, reached through ``self.store``, are
not followed. Calls through values of unknown type (an action picked from the registry, a
callback) never are. The walk's files, in the order it enters them (a run of calls within one
file is one entry), are printed with two counts:

- ``climbs``: entries into a file the walk had already entered and left (runner -> store ->
  runner counts one);
- ``stack climbs``: calls into a file already on the call chain above (the stricter kind:
  a callee calling back up into its caller's module).

Run: .venv/bin/python bench/walk_run_item.py [REPO_ROOT] [--depth N] [--typed] [--tree]
(compare commits: ``git worktree add /tmp/base 567f507`` or ``git archive 567f507 | tar -x -C
/tmp/base``, then walk both roots).
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("core", "console")
START = ("core.runs.runner", "Runner", "run_item")


@dataclass
class Klass:
    module: str
    name: str
    node: ast.ClassDef
    methods: dict[str, ast.AST] = field(default_factory=dict)
    attrs: dict[str, tuple[str, str]] = field(default_factory=dict)
    """self.attr -> (module, class) when the walk can tell."""


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    functions: dict[str, ast.AST] = field(default_factory=dict)
    classes: dict[str, Klass] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    """alias -> project module."""
    names: dict[str, tuple[str, str]] = field(default_factory=dict)
    """alias -> (project module, name) of ``from m import name``."""


class Project:
    def __init__(self, root: Path, *, typed: bool = False):
        self.root = root
        self.typed = typed
        self.mods: dict[str, Module] = {}
        for pkg in PACKAGES:
            for path in sorted((root / pkg).rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                name = ".".join(parts)
                self.mods[name] = Module(name, path, ast.parse(path.read_text()))
        for m in self.mods.values():
            self._index(m)
        for m in self.mods.values():
            for k in m.classes.values():
                self._attrs(k)

    # -- indexing ------------------------------------------------------------------------
    def _index(self, m: Module) -> None:
        for node in m.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                m.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                k = m.classes[node.name] = Klass(m.name, node.name, node)
                k.methods = {n.name: n for n in node.body
                             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        is_pkg = m.path.name == "__init__.py"
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in self.mods:
                        m.modules[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = m.name.split(".")[:None if is_pkg else -1]
                    parts = parts[:len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    alias = a.asname or a.name
                    if f"{base}.{a.name}" in self.mods:
                        m.modules[alias] = f"{base}.{a.name}"
                    elif base in self.mods:
                        m.names[alias] = (base, a.name)

    def _class_of(self, m: Module, expr: ast.AST | None) -> tuple[str, str] | None:
        """The project class an annotation or a constructor's callee names in ``m``."""
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(expr, ast.BinOp):  # ``Run | None``
            return self._class_of(m, expr.left) or self._class_of(m, expr.right)
        if isinstance(expr, ast.Name):
            if expr.id in m.classes:
                return m.name, expr.id
            if expr.id in m.names:
                mod, name = self._follow(*m.names[expr.id])
                if name in self.mods[mod].classes:
                    return mod, name
        if (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)
                and expr.value.id in m.modules):
            mod = m.modules[expr.value.id]
            if expr.attr in self.mods[mod].classes:
                return mod, expr.attr
        return None

    def _follow(self, mod: str, name: str, hops: int = 5) -> tuple[str, str]:
        """Where ``name`` of ``mod`` is defined (re-exports followed)."""
        m = self.mods[mod]
        while hops and name not in m.functions and name not in m.classes and name in m.names:
            mod, name = m.names[name]
            m, hops = self.mods[mod], hops - 1
        return mod, name

    def _attrs(self, k: Klass) -> None:
        m = self.mods[k.module]
        for meth in k.methods.values():
            params = {a.arg: self._class_of(m, a.annotation) for a in _args(meth)}
            for node in ast.walk(meth):
                if isinstance(node, ast.AnnAssign) and _self_attr(node.target):
                    t = self._class_of(m, node.annotation)
                elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                      and _self_attr(node.targets[0])):
                    v = node.value
                    t = (params.get(v.id) if isinstance(v, ast.Name) else
                         self._class_of(m, v.func) if isinstance(v, ast.Call) else None)
                    if t is None and isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name):
                        t = ("attr-of", params.get(v.value.id), v.attr)  # resolved below
                else:
                    continue
                target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
                if t is not None:
                    k.attrs.setdefault(target.attr, t)

    def attr_type(self, k: Klass, attr: str) -> tuple[str, str] | None:
        t = k.attrs.get(attr)
        if t and t[0] == "attr-of":
            _, owner, name = t
            if owner is None:
                return None
            ok = self.mods[owner[0]].classes[owner[1]]
            return self.attr_type(ok, name) if ok is not k else None
        return t

    def method(self, cls: tuple[str, str], name: str, seen=()) -> tuple[str, str, ast.AST] | None:
        """(module, class, function node) defining ``cls.name``, looking in named bases too."""
        mod, cname = cls
        k = self.mods[mod].classes.get(cname)
        if k is None or cls in seen:
            return None
        if name in k.methods:
            return mod, cname, k.methods[name]
        for base in k.node.bases:
            b = self._class_of(self.mods[mod], base)
            if b is not None:
                found = self.method(b, name, (*seen, cls))
                if found:
                    return found
        return None

    # -- resolving a call ----------------------------------------------------------------
    def callees(self, mod: str, klass: str | None, fn: ast.AST) -> list[tuple[str, str, ast.AST]]:
        """(module, qualified name, node) of each call in ``fn`` the walk can resolve."""
        m = self.mods[mod]
        k = m.classes.get(klass) if klass else None
        local = ({a.arg: self._class_of(m, a.annotation) for a in _args(fn)} if self.typed
                 else {})
        out = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                t = self._class_of(m, node.value.func)
                for tg in node.targets:
                    if isinstance(tg, ast.Name) and t and self.typed:
                        local[tg.id] = t
        for node in _calls_in_order(fn):
            target = self._resolve(m, k, local, node.func)
            if target is not None:
                out.append(target)
        return out

    def _resolve(self, m: Module, k: Klass | None, local: dict, f: ast.AST):
        def of_class(cls, name):
            found = self.method(cls, name) if cls else None
            return (found[0], f"{found[1]}.{name}", found[2]) if found else None

        def ctor(cls):
            return of_class(cls, "__init__")

        def defined(mod, name):  # a function, or a class's constructor, of ``mod``
            mod, name = self._follow(mod, name)
            tm = self.mods[mod]
            if name in tm.functions:
                return mod, name, tm.functions[name]
            return ctor((mod, name)) if name in tm.classes else None

        if isinstance(f, ast.Name):
            if f.id in m.functions or f.id in m.classes:
                return defined(m.name, f.id)
            return defined(*m.names[f.id]) if f.id in m.names else None
        if not isinstance(f, ast.Attribute):
            return None
        v = f.value
        if not self.typed and not (isinstance(v, ast.Name) and (
                v.id in ("self", "cls") or v.id in m.modules)):
            return None
        if isinstance(v, ast.Name):
            if v.id in ("self", "cls") and k is not None:
                return of_class((k.module, k.name), f.attr)
            if v.id in m.modules:
                return defined(m.modules[v.id], f.attr)
            if local.get(v.id):
                return of_class(local[v.id], f.attr)
            return None
        if _self_attr(v) and k is not None:
            return of_class(self.attr_type(k, v.attr), f.attr)
        return None


def _args(fn: ast.AST) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


def _self_attr(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self")


def _calls_in_order(fn: ast.AST) -> list[ast.Call]:
    """The calls in ``fn`` in the order they run: a call after its arguments' calls."""
    out: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child)
        if isinstance(node, ast.Call):
            out.append(node)

    for stmt in fn.body:
        visit(stmt)
    return out


@dataclass
class Walk:
    entries: list[str] = field(default_factory=list)
    """Files in the order the walk enters them (a run within one file: one entry)."""
    functions: int = 0
    stack_climbs: int = 0
    tree: list[str] = field(default_factory=list)
    """Each visited function, indented by its depth (``--tree``)."""

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(self.entries))

    @property
    def climbs(self) -> int:
        return len(self.entries) - len(self.files)


def walk(root: Path, depth: int, *, typed: bool = False) -> Walk:
    p = Project(root, typed=typed)
    mod, cls, name = START
    w = Walk()
    seen: set[tuple[str, str]] = set()

    def rel(module: str) -> str:
        return p.mods[module].path.relative_to(root).as_posix()

    def visit(module: str, qual: str, node: ast.AST, stack: list[str], left: int) -> None:
        seen.add((module, qual))
        w.functions += 1
        f = rel(module)
        w.tree.append(f"{'  ' * len(stack)}{Path(f).stem}.{qual}")
        if not w.entries or w.entries[-1] != f:
            w.entries.append(f)
            if stack and f != stack[-1] and f in stack:
                w.stack_climbs += 1
        if left == 0:
            return
        klass = qual.split(".")[0] if "." in qual else None
        for cmod, cqual, cnode in p.callees(module, klass, node):
            if (cmod, cqual) in seen:
                continue
            visit(cmod, cqual, cnode, stack + [f], left - 1)

    start = p.mods[mod].classes[cls].methods[name]
    visit(mod, f"{cls}.{name}", start, [], depth)
    return w


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--depth", type=int, default=8, help="calls deep (the walk is whole "
                    "from 6 on, at 567f507 and since)")
    ap.add_argument("--typed", action="store_true", help="also follow calls on values of a "
                    "known project class (self.store.f(), ...)")
    ap.add_argument("--quiet", action="store_true", help="the counts only")
    ap.add_argument("--tree", action="store_true", help="also each function visited")
    a = ap.parse_args(argv)
    w = walk(Path(a.root), a.depth, typed=a.typed)
    if a.tree:
        print("\n".join(w.tree))
    if not a.quiet:
        print(" -> ".join(Path(e).stem for e in w.entries))
    print(f"{a.root}: depth {a.depth}{' typed' if a.typed else ''}: {w.functions} functions, "
          f"{len(w.files)} files, "
          f"{len(w.entries)} entries, {w.climbs} climbs back, {w.stack_climbs} stack climbs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
