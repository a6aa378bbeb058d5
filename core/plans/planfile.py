"""Plan files: YAML read into the typed model (:mod:`core.plans.plan`), validated as a whole.

A plan is intent: specdeck never rewrites it behind the user's back (state lives in the
store). Loading validates everything before anything runs or is written, and every problem
is reported with ``file:line:col``, the item id and the field, e.g.::

    plans/v5.yaml:14:15: item 'relay-ckpt': field 'action.params.src': unknown host 'kpro7'

Positions come from composing the YAML node tree ourselves (:class:`_Located`) instead of
``yaml.safe_load``, so that each value keeps the mark where it was written.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import yaml

from core.actions import registry
from core.plans import arms
from core.plans.adopt_spec import parse_spec
from core.capsules.telemetry import TelemetrySettings
from core.errors import InvalidInput, PlanError
from core.plans.params import ParamError, parse_params, shell_fields
from core.plans.plan import (ENV_NAME, PRIORITIES, SECRET_NAME, SLUG, STATUSES, VAR_REF, ActionSpec,
                       HostSpec, Item, Plan, PlanIssue, Price)
from core.text import did_you_mean, short

# -- YAML with positions ------------------------------------------------------------------
MAX_PLAN_CHARS = 16 << 20
"""A plan file larger than this is refused before it is read (a real one is a few KB; an
imported 100,000-item todo list is about 8 MB)."""
MAX_YAML_DEPTH = 32
"""Deepest nesting of mappings and lists in a plan."""
MAX_YAML_VALUES = 1_000_000
"""Most values a plan may expand to, aliases counted at every use (billion laughs)."""


class _TooBig(Exception):
    def __init__(self, node, message: str):
        self.line, self.col = node.start_mark.line + 1, node.start_mark.column + 1
        self.message = message


class _Located:
    """Plain Python values from a YAML document plus the (line, col) of each path."""

    def __init__(self, text: str, filename: str):
        self.filename = filename
        self.key_marks: dict[tuple, tuple[int, int]] = {}
        self.value_marks: dict[tuple, tuple[int, int]] = {}
        self.issues: list[PlanIssue] = []
        # The C loader composes the same nodes, marks included, about 10x faster (a 200-item
        # plan: 0.17 s -> 0.02 s); the pure-Python one when libyaml is missing.
        self._budget = MAX_YAML_VALUES
        self._path_nodes: set[int] = set()
        loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        self.data = None
        if len(text) > MAX_PLAN_CHARS:
            self.issues.append(PlanIssue(filename, 1, 1, f"the plan is {len(text):,} characters; "
                                         f"plans are at most {MAX_PLAN_CHARS:,}"))
            return
        if not self._bounded(loader_cls, text):
            return
        loader = loader_cls(text)
        try:
            node = loader.get_single_node()
            self.data = self._walk(loader, node, ()) if node is not None else None
        except _TooBig as e:
            self.issues.append(PlanIssue(filename, e.line, e.col, e.message))
            self.data = None
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            msg = " ".join(str(x) for x in (e.context, e.problem) if x) or str(e)
            self.issues.append(PlanIssue(filename, line, col, f"YAML syntax: {msg}"))
            self.data = None
        except yaml.YAMLError as e:
            self.issues.append(PlanIssue(filename, 1, 1, f"YAML error: {e}"))
            self.data = None
        finally:
            loader.dispose()

    @classmethod
    def of_data(cls, data: Any, filename: str) -> "_Located":
        """Values built in memory (an import about to be written): no positions (1:1)."""
        loc = cls.__new__(cls)
        loc.filename, loc.data, loc.issues = filename, data, []
        loc.key_marks, loc.value_marks = {}, {}
        return loc

    def _bounded(self, loader_cls, text: str) -> bool:
        """Check nesting depth on the event stream (iterative) before composing nodes
        (recursive); False with an issue when the plan nests too deeply."""
        depth = 0
        loader = loader_cls(text)
        try:
            while loader.check_event():
                ev = loader.get_event()
                if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                    depth += 1
                    if depth > MAX_YAML_DEPTH:
                        m = ev.start_mark
                        self.issues.append(PlanIssue(
                            self.filename, m.line + 1, m.column + 1,
                            f"nested more than {MAX_YAML_DEPTH} levels deep; a plan needs a "
                            "handful"))
                        return False
                elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                    depth -= 1
        except yaml.YAMLError:
            return True  # composing again reports the syntax error with its position
        finally:
            loader.dispose()
        return True

    def _walk(self, loader, node, path):
        self._budget -= 1
        if self._budget < 0:
            raise _TooBig(node, f"aliases expand the plan to more than {MAX_YAML_VALUES:,} "
                          "values (an alias bomb?); write the values out or use fewer aliases")
        if len(path) > MAX_YAML_DEPTH:
            raise _TooBig(node, f"nested more than {MAX_YAML_DEPTH} levels deep")
        if id(node) in self._path_nodes:
            raise _TooBig(node, "an alias refers to a value that contains it (a recursive "
                          "alias)")
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            self._path_nodes.add(id(node))
            try:
                return self._walk_collection(loader, node, path)
            finally:
                self._path_nodes.discard(id(node))
        self.value_marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        return loader.construct_object(node, deep=True)

    def _walk_collection(self, loader, node, path):
        self.value_marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict = {}
            loader.flatten_mapping(node)
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    self._issue(knode, "a mapping key must be a plain scalar")
                    continue
                key = loader.construct_object(knode, deep=True)
                if isinstance(key, (list, dict)):
                    self._issue(knode, "a mapping key must be a plain scalar")
                    continue
                if key in out:
                    self._issue(knode, f"duplicate key {key!r}")
                    continue
                self.key_marks[path + (key,)] = (knode.start_mark.line + 1,
                                                 knode.start_mark.column + 1)
                out[key] = self._walk(loader, vnode, path + (key,))
            return out
        return [self._walk(loader, v, path + (i,)) for i, v in enumerate(node.value)]

    def _issue(self, node, msg):
        self.issues.append(PlanIssue(self.filename, node.start_mark.line + 1,
                                     node.start_mark.column + 1, msg))

    def mark(self, path: tuple, *, key: bool = False) -> tuple[int, int]:
        """The position of ``path`` (its key when ``key``), or of its nearest written parent."""
        p = tuple(path)
        while True:
            if key and p in self.key_marks:
                return self.key_marks[p]
            if p in self.value_marks:
                return self.value_marks[p]
            if p in self.key_marks:
                return self.key_marks[p]
            if not p:
                return (1, 1)
            p = p[:-1]


def _field_name(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


class _Validator:
    def __init__(self, loc: _Located):
        self.loc = loc
        self.issues = list(loc.issues)
        self.origins: dict[int, tuple[str, str]] = {}
        """Expanded items' indexes -> (template, arm) (:func:`core.plans.arms.expand`)."""

    def error(self, path: tuple, message: str, *, item: str | None = None,
              field_path: tuple | None = None, key: bool = False) -> None:
        line, col = self.loc.mark(path, key=key)
        self.issues.append(PlanIssue(self.loc.filename, line, col, message, item,
                                     _field_name(field_path) if field_path else None))


MAX_ENV_VALUE = 65536
ENV_VALUE_RULE = "text without NUL, 64 KiB at most"
"""Host env values and plan vars (both reach a run's environment): an environment string
cannot hold NUL, and one far larger than this fails the command's exec (E2BIG)."""


def _env_safe(value: Any) -> bool:
    s = str(value)
    return "\0" not in s and len(s) <= MAX_ENV_VALUE


def _check_keys(v: _Validator, data: dict, path: tuple, allowed: Iterable[str], *,
                item: str | None = None, base: tuple = ()) -> None:
    allowed = list(allowed)
    for k in data:
        if k not in allowed:
            v.error(path + (k,), f"unknown key {k!r} (known: {', '.join(allowed)})",
                    item=item, field_path=base + (k,), key=True)


def _interpolate(value: Any, variables: dict, shell: bool, errors: list[tuple[tuple, str]],
                 path: tuple) -> Any:
    """Replace ``${name}`` in strings (``$$`` is a literal ``$``). In shell text (``shell``)
    the value is not spliced: see :mod:`core.plans.shellvars` (it travels in the environment)."""
    if isinstance(value, str) and shell:
        from core.plans import shellvars

        return shellvars.splice(value, lambda name: name in variables, lambda name: errors.append(
            (path, f"undefined variable ${{{name}}} (define it under vars:)")))
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(0) == "$$":
                return "$"
            name = m.group(1)
            if name not in variables:
                errors.append((path, f"undefined variable ${{{name}}} (define it under vars:)"))
                return m.group(0)
            s = variables[name]
            s = s if isinstance(s, str) else json.dumps(s)
            return shlex.quote(s) if shell else s

        return VAR_REF.sub(sub, value)
    if isinstance(value, list):
        return [_interpolate(x, variables, shell, errors, path + (i,)) for i, x in enumerate(value)]
    if isinstance(value, dict):
        return {k: _interpolate(x, variables, shell, errors, path + (k,)) for k, x in value.items()}
    return value


def parse_plan(text: str, filename: str = "<plan>", *, path: Path | None = None) -> Plan:
    """Parse and validate a plan; raise :class:`PlanError` listing every problem."""
    return _plan_of(_Located(text, filename), path)


def plan_from_data(data: Any, text: str, filename: str) -> Plan:
    """Validate plan values built in memory, and ``text``, the YAML they will be written as
    (``specdeck import`` before it writes them), as :func:`parse_plan` would read that text,
    without composing the YAML again (100,000 items: seconds, not minutes)."""
    if len(text) > MAX_PLAN_CHARS:
        raise PlanError([PlanIssue(filename, 1, 1, f"the plan would be {len(text):,} "
                                   f"characters; plans are at most {MAX_PLAN_CHARS:,}")])
    values, todo = 0, [data]
    while todo:
        x = todo.pop()
        values += 1
        todo.extend(x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())
    if values > MAX_YAML_VALUES:
        raise PlanError([PlanIssue(filename, 1, 1, f"the plan would hold {values:,} values; "
                                   f"plans hold at most {MAX_YAML_VALUES:,}")])
    return _plan_of(_Located.of_data(data, filename), None)


def _plan_of(loc: _Located, path: Path | None) -> Plan:
    v = _Validator(loc)
    data = loc.data
    if v.issues:
        raise PlanError(v.issues)
    if not isinstance(data, dict):
        v.error((), "a plan is a mapping with name, hosts, vars and items")
        raise PlanError(v.issues)
    _check_keys(v, data, (), ("name", "hosts", "vars", "items", "state", "telemetry", "notify",
                              "arms"))
    arm_set, v.origins = arms.expand(loc, v.error, _param_names)
    data = loc.data  # (the expanded items)
    state = _parse_state(v, data.get("state"))
    telemetry = _parse_telemetry(v, data.get("telemetry"))
    notify = _parse_notify(v, data.get("notify"))
    name = _parse_name(v, data.get("name"))
    variables = _parse_vars(v, data.get("vars") or {})
    raw_hosts = data.get("hosts") or {}
    if not isinstance(raw_hosts, dict):
        v.error(("hosts",), "hosts must be a mapping of name: {local|ssh, workdir}",
                field_path=("hosts",))
        raw_hosts = {}
    hosts = _parse_hosts(v, raw_hosts)
    items = _parse_items(v, loc, data.get("items"), hosts, raw_hosts, variables)
    _check_deps(v, items)
    _check_cycles(v, items)

    if state is not None:
        state = str(((path.parent if path else Path.cwd()) / Path(state).expanduser()).resolve())
    plan = Plan(name, path, hosts, dict(variables), tuple(items), state, telemetry, notify,
                arm_set)
    _check_kind_rules(v, plan)
    if v.issues:
        raise PlanError(v.issues)
    return plan


def _parse_state(v: _Validator, state: Any) -> str | None:
    """``state:``, the state database's path as written (None: none, or not a path)."""
    if state is not None and (not isinstance(state, str) or not state.strip()):
        v.error(("state",), "state: the state database's path (relative to the plan file)",
                field_path=("state",))
        return None
    return state


def _parse_telemetry(v: _Validator, raw: Any) -> TelemetrySettings:
    """``telemetry:``, the sampling of train runs' hosts and its alerts (defaults if absent)."""
    try:
        return parse_params(TelemetrySettings, raw)
    except ExceptionGroup as eg:
        for e in eg.exceptions:
            v.error(("telemetry",) + e.path, e.message,
                    field_path=("telemetry",) + e.path, key="unknown field" in e.message)
        return TelemetrySettings()


def _parse_notify(v: _Validator, notify: Any) -> tuple[str, ...]:
    """``notify:``, the events a notification is sent for (where to: the user's config,
    never the plan: :mod:`core.runs.notify`)."""
    from core.ml.tasks.notify import EVENTS

    if notify is None:
        return ()
    where = ("~/.config/specdeck/notify (mode 0600) or $SPECDECK_NOTIFY")
    if isinstance(notify, str) and "://" in notify:
        v.error(("notify",), f"notify: names events, not a target: a notification URL is a "
                f"secret and never goes in a plan; put it in {where}", field_path=("notify",))
        return ()
    if not isinstance(notify, list):
        v.error(("notify",), f"notify: a list of events, some of {', '.join(EVENTS)}",
                field_path=("notify",))
        return ()
    out: list[str] = []
    for i, ev in enumerate(notify):
        if isinstance(ev, str) and "://" in ev:
            v.error(("notify", i), f"notify: a notification URL is a secret and never goes "
                    f"in a plan; put it in {where}", field_path=("notify",))
        elif ev not in EVENTS:
            v.error(("notify", i), f"notify: unknown event {ev!r}; one of {', '.join(EVENTS)}"
                    + did_you_mean(str(ev), EVENTS), field_path=("notify",))
        elif ev not in out:
            out.append(ev)
    return tuple(out)


def _parse_name(v: _Validator, name: Any) -> str:
    """``name:``, a slug (``plan`` stands in for a missing one, so the rest is checked)."""
    if not isinstance(name, str) or not name.strip():
        v.error(("name",), "name: a non-empty string is required", field_path=("name",))
        return "plan"
    if not SLUG.match(name):
        v.error(("name",), f"name {name!r} must be a slug (letters, digits, _ . -; 64 at most)",
                field_path=("name",))
    return name


def _parse_vars(v: _Validator, variables: Any) -> dict:
    """``vars:``, checked as environment values (each travels in a run's environment)."""
    if not isinstance(variables, dict):
        v.error(("vars",), "vars must be a mapping of name: value", field_path=("vars",))
        return {}
    for k, val in variables.items():
        if not isinstance(val, (str, int, float, bool)):
            v.error(("vars", k), f"var {k!r} must be a string or number", field_path=("vars", k))
        elif not _env_safe(val):  # a var travels in the environment as an env value does
            v.error(("vars", k), f"var {k!r} must be {ENV_VALUE_RULE}", field_path=("vars", k))
        if SECRET_NAME.search(str(k)):
            v.error(("vars", k), f"var {k!r} looks like a secret: secrets never go in plans; "
                    "keep them in the host's environment or ssh-agent", field_path=("vars", k),
                    key=True)
    return variables


def _parse_hosts(v: _Validator, raw_hosts: dict) -> dict[str, HostSpec]:
    """``hosts:``, by name (a host whose name or shape is wrong is left out)."""
    hosts: dict[str, HostSpec] = {}
    for hname, h in raw_hosts.items():
        hp = ("hosts", hname)
        if not isinstance(hname, str) or not SLUG.match(hname):
            v.error(hp, f"host name {hname!r} must be a slug (letters, digits, _ . -; 64 at "
                    "most)", key=True)
            continue
        if not isinstance(h, dict):
            v.error(hp, "a host is {local: true, workdir: PATH} or {ssh: ALIAS, workdir: PATH}",
                    field_path=hp)
            continue
        hosts[hname] = _parse_host(v, hname, h)
    return hosts


def _parse_host(v: _Validator, hname: str, h: dict) -> HostSpec:
    hp = ("hosts", hname)
    _check_keys(v, h, hp, ("local", "ssh", "workdir", "python", "env", "price"), base=hp)
    local, ssh = h.get("local"), h.get("ssh")
    if local not in (None, True, False):
        v.error(hp + ("local",), "local must be true or false", field_path=hp + ("local",))
    if bool(local) == bool(ssh):
        v.error(hp, f"host {hname!r} needs exactly one of `local: true` or `ssh: ALIAS`",
                field_path=hp)
    if ssh is not None and (not isinstance(ssh, str) or not ssh or ssh.startswith("-")
                            or any(c.isspace() for c in ssh)):
        v.error(hp + ("ssh",), "ssh must be an alias or user@host[:port]",
                field_path=hp + ("ssh",))
    wd = h.get("workdir")
    if not isinstance(wd, str) or not wd:
        v.error(hp + ("workdir",), "workdir: a path is required", field_path=hp + ("workdir",))
    py = h.get("python")
    if py is not None and not isinstance(py, str):
        v.error(hp + ("python",), "python must be a path", field_path=hp + ("python",))
    env = _parse_host_env(v, hp, h.get("env") or {})
    return HostSpec(hname, wd if isinstance(wd, str) else ".", bool(local),
                    ssh if isinstance(ssh, str) else None,
                    py if isinstance(py, str) else None,
                    {str(k): str(x) for k, x in env.items()},
                    _parse_price(v, hp, h["price"]) if "price" in h else None)


PRICE_SHAPE = "price is {per_hour: N} or {per_gpu_hour: N, gpus: G}, with currency: CODE optional (default USD)"
CURRENCY = re.compile(r"^[A-Za-z$€£¥]{1,8}\Z")
MAX_PRICE = 1e6
"""Per hour: far above any machine's, so a typo (a price per month) is caught."""


def _parse_price(v: _Validator, hp: tuple, raw: Any) -> Price | None:
    """A host's ``price:`` (:class:`~core.plans.plan.Price`); None, with each problem named by
    file:line and field, when it is not one."""
    pp = hp + ("price",)
    if not isinstance(raw, dict):
        v.error(pp, PRICE_SHAPE, field_path=pp)
        return None
    _check_keys(v, raw, pp, ("per_hour", "per_gpu_hour", "gpus", "currency"), base=pp)
    rates = [k for k in ("per_hour", "per_gpu_hour") if k in raw]
    if len(rates) != 1:
        v.error(pp, f"give exactly one of per_hour or per_gpu_hour ({PRICE_SHAPE})", field_path=pp)
        return None
    key = rates[0]
    amount, ok = raw[key], True
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0 <= amount <= MAX_PRICE:
        v.error(pp + (key,), f"{key} must be a number from 0 to {MAX_PRICE:g} (what an hour costs, "
                f"e.g. 2.49), not {amount!r}", field_path=pp + (key,))
        ok = False
    gpus = raw.get("gpus", 1)
    if "gpus" in raw and key != "per_gpu_hour":
        v.error(pp + ("gpus",), "gpus goes with per_gpu_hour (per_hour is the whole host's)",
                field_path=pp + ("gpus",))
        ok = False
    elif isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 4096:
        v.error(pp + ("gpus",), f"gpus must be a whole number from 1 to 4096 (the GPUs a run holds), "
                f"not {gpus!r}", field_path=pp + ("gpus",))
        ok = False
    currency = raw.get("currency", "USD")
    if not isinstance(currency, str) or not CURRENCY.match(currency):
        v.error(pp + ("currency",), f"currency must be a code such as USD or EUR, not {currency!r}",
                field_path=pp + ("currency",))
        ok = False
    if not ok:
        return None
    return Price(float(amount), "gpu_hour" if key == "per_gpu_hour" else "hour", gpus, currency)


def _parse_host_env(v: _Validator, hp: tuple, env: Any) -> dict:
    """A host's ``env:``: shell variable names, values fit for an environment, no secrets."""
    if not isinstance(env, dict):
        v.error(hp + ("env",), "env must be a mapping", field_path=hp + ("env",))
        return {}
    for ek, ev in env.items():
        if not isinstance(ek, str) or not ENV_NAME.match(ek):
            v.error(hp + ("env", ek), f"env name {ek!r} must be a shell variable name "
                    "(letters, digits, _; not starting with a digit; 128 at most)",
                    field_path=hp + ("env", ek), key=True)
        if not isinstance(ev, (str, int, float)) or isinstance(ev, bool):
            v.error(hp + ("env", ek), "env values must be strings", field_path=hp + ("env", ek))
        elif not _env_safe(ev):
            v.error(hp + ("env", ek), f"env values must be {ENV_VALUE_RULE}",
                    field_path=hp + ("env", ek))
        if SECRET_NAME.search(str(ek)):
            v.error(hp + ("env", ek), f"env {ek!r} looks like a secret: secrets never go in "
                    "plans; export it in the host's shell profile instead",
                    field_path=hp + ("env", ek), key=True)
    return env


def _parse_items(v: _Validator, loc: _Located, raw_items: Any, hosts: dict[str, HostSpec],
                 raw_hosts: dict, variables: dict) -> list[Item]:
    """``items:``, in order (an item that is not a mapping is left out)."""
    if not isinstance(raw_items, list):
        v.error(("items",), "items: a list of todo items is required", field_path=("items",))
        raw_items = []
    items: list[Item] = []
    seen: dict[str, int] = {}
    for i, it in enumerate(raw_items):
        ip = ("items", i)
        if not isinstance(it, dict):
            v.error(ip, "an item is a mapping with id, content, priority, needs, action")
            continue
        item = _parse_item(v, loc, i, it, seen, hosts, raw_hosts, variables)
        if i in v.origins:
            item = replace(item, template=v.origins[i][0], arm=v.origins[i][1])
        items.append(item)
    return items


def _param_names(kind: Any) -> list[str] | None:
    """The params of an action kind (None: no such kind)."""
    import dataclasses

    if kind not in registry.kinds():
        return None
    return [f.name for f in dataclasses.fields(registry.get(kind).Params) if f.init]


def _parse_item(v: _Validator, loc: _Located, i: int, it: dict, seen: dict[str, int],
                hosts: dict[str, HostSpec], raw_hosts: dict, variables: dict) -> Item:
    """Item ``#i + 1``; ``seen``: the ids before it (by index), this one added."""
    ip = ("items", i)
    iid = it.get("id")
    ok_id = isinstance(iid, str) and (SLUG.match(iid) or (i in v.origins and arms.ARM_ITEM.match(iid)))
    label = iid if ok_id else f"#{i + 1}"
    _check_keys(v, it, ip, ("id", "content", "priority", "status", "needs", "after",
                            "retries", "on_preempt", "action", "adopt", "decide"), item=label)
    if not ok_id:
        v.error(ip + ("id",), f"id must be a slug (letters, digits, _ . -; 64 at most), got "
                f"{short(iid)}",
                item=label, field_path=("id",))
    elif iid in seen:
        v.error(ip + ("id",), f"duplicate id (first used by item #{seen[iid] + 1})",
                item=label, field_path=("id",))
    else:
        seen[iid] = i
    content = it.get("content")
    if not isinstance(content, str) or not content.strip():
        v.error(ip + ("content",), "content: the todo text is required", item=label,
                field_path=("content",))
    prio = it.get("priority", "medium")
    if prio not in PRIORITIES:
        v.error(ip + ("priority",), f"priority must be one of {', '.join(PRIORITIES)}, "
                f"got {prio!r}", item=label, field_path=("priority",))
    status = it.get("status")
    if status is not None and status not in STATUSES:
        v.error(ip + ("status",), f"status must be one of {', '.join(STATUSES)}, got "
                f"{status!r}", item=label, field_path=("status",))
    needs, after = (_id_list(v, it, ip, key, label) for key in ("needs", "after"))
    retries = it.get("retries", 0)
    if type(retries) is not int or not 0 <= retries <= MAX_RETRIES:
        v.error(ip + ("retries",), f"retries must be a whole number from 0 to {MAX_RETRIES}"
                f", got {short(retries)}", item=label, field_path=("retries",))
        retries = 0
    on_preempt = it.get("on_preempt", "fail")
    if on_preempt not in ON_PREEMPT:
        v.error(ip + ("on_preempt",), f"on_preempt must be one of {', '.join(ON_PREEMPT)}, got "
                f"{short(on_preempt)}", item=label, field_path=("on_preempt",))
        on_preempt = "fail"
    decide = _decide(v, it.get("decide"), ip + ("decide",), label)
    action = None
    raw_action = it.get("action")
    if raw_action is not None:
        action = _parse_action(v, raw_action, ip + ("action",), label, hosts, raw_hosts,
                               variables, registry)
    adopt = _parse_adopt(v, it.get("adopt"), ip + ("adopt",), label, action, variables)
    return Item(label, content if isinstance(content, str) else "",
                prio if prio in PRIORITIES else "medium",
                status if status in STATUSES else None, tuple(needs), action,
                loc.mark(ip)[0], adopt, tuple(after), retries, decide, on_preempt=on_preempt)


def _check_deps(v: _Validator, items: list[Item]) -> None:
    """Every ``needs`` / ``after`` names another item of the plan."""
    ids = {it.id for it in items}
    for i, it in enumerate(items):
        for key, deps in (("needs", it.needs), ("after", it.after)):
            for j, n in enumerate(deps):
                if n not in ids:
                    v.error(("items", i, key, j), f"{key} unknown item {n!r}", item=it.id,
                            field_path=(key,))
                elif n == it.id:
                    v.error(("items", i, key, j), "an item cannot "
                            + ("need" if key == "needs" else "come after") + " itself",
                            item=it.id, field_path=(key,))


def _check_kind_rules(v: _Validator, plan: Plan) -> None:
    """Cross-item rules each kind knows about (relay's hosts, stop's item...)."""
    for i, it in enumerate(plan.items):
        if it.action is None or it.action.params is None:
            continue
        cls = registry.get(it.action.kind)
        for fpath, msg in cls.validate_plan(it.action.params, plan, it):
            v.error(("items", i, "action", "params") + tuple(fpath), msg, item=it.id,
                    field_path=("action", "params") + tuple(fpath))


def _parse_action(v, raw, ap, label, hosts, raw_hosts, variables, registry) -> ActionSpec | None:
    if not isinstance(raw, dict):
        v.error(ap, "action must be a mapping {kind, host, params}", item=label,
                field_path=("action",))
        return None
    _check_keys(v, raw, ap, ("kind", "host", "params"), item=label, base=("action",))
    kind = raw.get("kind")
    if kind not in registry.kinds():
        v.error(ap + ("kind",), f"unknown action kind {kind!r} (known: "
                f"{', '.join(registry.kinds())})", item=label, field_path=("action", "kind"))
        return None
    cls = registry.get(kind)
    host = raw.get("host")
    if host is None and cls.needs_host:
        v.error(ap, f"action {kind!r} needs a host (one of: {', '.join(raw_hosts) or 'none defined'})",
                item=label, field_path=("action", "host"))
    elif host is not None and host not in raw_hosts:
        v.error(ap + ("host",), f"unknown host {host!r} (defined: {', '.join(raw_hosts) or 'none'})",
                item=label, field_path=("action", "host"))
    raw_params = raw.get("params") or {}
    errors: list[tuple[tuple, str]] = []
    shells = shell_fields(cls.Params)
    interp = raw_params
    if isinstance(raw_params, dict):
        interp = {k: _interpolate(val, variables, k in shells, errors, (k,))
                  for k, val in raw_params.items()}
    for p, msg in errors:
        v.error(ap + ("params",) + p, msg, item=label, field_path=("action", "params") + p)
    params = None
    try:
        params = parse_params(cls.Params, interp)
    except ExceptionGroup as eg:
        for e in eg.exceptions:
            assert isinstance(e, ParamError)
            v.error(ap + ("params",) + e.path, e.message, item=label,
                    field_path=("action", "params") + e.path,
                    key="unknown field" in e.message)
    return ActionSpec(kind, host, params, raw_params if isinstance(raw_params, dict) else {})


def _parse_adopt(v, raw, ap, label, action, variables):
    if raw is None:
        return None
    errors: list[tuple[tuple, str]] = []
    spec, problems = parse_spec(_interpolate(raw, variables, False, errors, ()))
    if action is None or not registry.get(action.kind).detached:
        problems.append(((), "adopt needs a detached action (shell, train, eval...)"))
    for p, msg in errors + problems:
        v.error(ap + p, msg, item=label, field_path=("adopt",) + p, key=bool(p))
    return spec


MAX_RETRIES = 100
ON_PREEMPT = ("fail", "resume")
"""``on_preempt:`` values (:attr:`core.plans.plan.Item.on_preempt`)."""


def _decide(v: _Validator, raw: Any, path: tuple, label: str) -> tuple[tuple[str, str], ...]:
    """``decide:``: the pairs of drafters (as ``compare`` labels them) this item decides
    between, e.g. ``[[v5, v4]]``; ``compare`` and the console's tau pane lead with them."""
    if raw is None:
        return ()
    ok = isinstance(raw, list) and raw and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x.strip() for x in p)
        and p[0] != p[1] for p in raw)
    if not ok:
        v.error(path, f"decide must be a list of pairs of two different drafter labels, e.g. "
                f"[[v5, v4]], got {short(raw)}", item=label, field_path=("decide",))
        return ()
    return tuple(dict.fromkeys((a, b) for a, b in raw))


def _id_list(v: _Validator, it: dict, ip: tuple, key: str, label: str) -> list[str]:
    """``needs`` / ``after``: a list of item ids (one id alone is allowed)."""
    ids = it.get(key) or []
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or not all(isinstance(n, str) for n in ids):
        v.error(ip + (key,), f"{key} must be a list of item ids", item=label, field_path=(key,))
        ids = []
    return ids


def _check_cycles(v: _Validator, items: list[Item]) -> None:
    graph: dict[str, list[str]] = {}
    index: dict[str, int] = {}
    for i, it in enumerate(items):  # a duplicated id is reported once, as a duplicate
        if it.id not in graph:
            graph[it.id] = [n for n in it.deps if n != it.id]
            index[it.id] = i
    color: dict[str, int] = {}

    # Iterative depth-first search (a chain of thousands of items must not recurse).
    for root in graph:
        if color.get(root) is not None:
            continue
        color[root] = 1
        path = [root]
        todo = [iter(graph[root])]
        while todo:
            n = path[-1]
            m = next(todo[-1], None)
            if m is None:
                color[n] = 2
                path.pop()
                todo.pop()
                continue
            if m not in graph:
                continue
            if color.get(m) == 1:
                cyc = path[path.index(m):] + [m]
                shown = " -> ".join(cyc if len(cyc) <= 12 else
                                    cyc[:6] + [f"… ({len(cyc) - 8} more)"] + cyc[-2:])
                v.error(("items", index[n], "needs"), "cyclic needs: " + shown,
                        item=n, field_path=("needs",))
            elif color.get(m) is None:
                color[m] = 1
                path.append(m)
                todo.append(iter(graph[m]))


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file.

    Raises:
        PlanError: the plan is invalid (every problem, with file:line:col).
        InvalidInput: the file cannot be read.
    """
    from core.text import read_bounded

    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise InvalidInput(f"{p}: no such plan file", hint="plans live under plans/*.yaml")
    # A device, a FIFO or a huge file is refused by type and size before a byte is read.
    raw = read_bounded(p, MAX_PLAN_CHARS, "plan file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{p}: cannot read plan: not UTF-8 text (byte {e.start}: "
                           f"{e.reason})") from None
    return parse_plan(text, str(p), path=p.resolve())


__all__ = ["load_plan", "parse_plan", "plan_from_data"]
