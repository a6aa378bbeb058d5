"""``${var}`` in shell text: values travel in the environment, never in the text.

Splicing a quoted value into shell text is only safe in the quoting context the quoting was
made for: ``shlex.quote`` inside double quotes (``echo "${x}"``) leaves ``$(...)`` and
backticks live. So a plan's ``${name}`` in a shell field becomes a reference to the
environment variable :func:`env_name` (``SPECDECK_VAR_name``), written for the context it
stands in (unquoted: ``"${SPECDECK_VAR_name}"``; inside double quotes: ``${SPECDECK_VAR_name}``;
inside single quotes: ``'"${SPECDECK_VAR_name}"'``), and the runner exports every plan var
under that name in the run's capsule (:func:`plan_env`). The value's bytes arrive literally
whatever they hold: the shell never parses an expanded value again.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

PREFIX = "SPECDECK_VAR_"
_REF = re.compile(r"\$\$|\$\{([^}]*)\}")


def env_name(var: str) -> str:
    """The environment variable carrying plan var ``var`` (any name maps to a valid one)."""
    return PREFIX + re.sub(r"[^A-Za-z0-9]", lambda m: f"_{ord(m.group()):x}_", str(var))


def value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def plan_env(variables: dict, *texts: str) -> dict[str, str]:
    """The plan vars that ``texts`` (a run's command, as :func:`splice` wrote it) refer to,
    under their :func:`env_name` (exported in that run's capsule). A var reaches only the
    runs whose commands use it: one large var cannot fill every other run's environment
    (an exec fails with E2BIG past the kernel's limit). Without ``texts``: every var."""
    out = {}
    for k, v in variables.items():
        name = env_name(k)
        if not texts or any("${" + name + "}" in t for t in texts):
            out[name] = value_text(v)
    return out


_SPLICED = re.compile(r"""'"\$\{%s([A-Za-z0-9_]*)\}"'|\$\{%s([A-Za-z0-9_]*)\}""" % (PREFIX, PREFIX))


def unsplice(text: str) -> str:
    """:func:`splice` read back for a person: each reference shows the plan var's name
    (``status --json`` and the console show ``${name}``, not the environment plumbing). The
    double quotes splice put around an unquoted reference stay: that is how it runs."""
    def back(m: re.Match) -> str:
        enc = next(g for g in m.groups() if g is not None)
        name = "${" + re.sub(r"_([0-9a-f]+)_", lambda h: chr(int(h.group(1), 16)), enc) + "}"
        return name  # inside single quotes, splice closed and reopened them around it
    return _SPLICED.sub(back, text)


def splice(text: str, known: Callable[[str], bool], on_undefined: Callable[[str], None]) -> str:
    """Replace each ``${name}`` of ``text`` (shell text) by a reference to its environment
    variable, written for the quoting context it stands in; ``$$`` is a literal ``$``.

    A small shell lexer follows the context: unquoted, ``'...'``, ``$'...'``, ``"..."``,
    backslash escapes, and ``$(...)`` / backticks (unquoted inside, even within ``"..."``).
    """
    out: list[str] = []
    stack = ["u"]  # contexts: u unquoted, s '...', a $'...', d "...", p $( ), b `...`
    parens = [0]
    i, n = 0, len(text)
    while i < n:
        ctx = stack[-1]
        m = _REF.match(text, i) if text[i] == "$" else None
        if m is not None and m.group(0) == "$$":
            out.append("$")
            i += 2
            continue
        if m is not None and m.group(0) != "$$":
            name = m.group(1)
            if not known(name):
                on_undefined(name)
                out.append(m.group(0))
            else:
                ref = "${" + env_name(name) + "}"
                if ctx == "d":
                    out.append(ref)
                elif ctx == "s":
                    out.append("'\"" + ref + "\"'")
                elif ctx == "a":
                    out.append("'\"" + ref + "\"$'")
                else:
                    out.append('"' + ref + '"')
            i = m.end()
            continue
        c = text[i]
        if ctx == "s":
            if c == "'":
                stack.pop()
            out.append(c)
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            out.append(text[i:i + 2])
            i += 2
            continue
        opener = text[i:i + 2]
        if ctx != "a" and (opener == "$(" or opener == "$'" and ctx != "d"):
            stack.append("p" if opener == "$(" else "a")
            if opener == "$(":
                parens.append(0)
            out.append(opener)
            i += 2
            continue
        if ctx == "a":
            if c == "'":
                stack.pop()
        elif ctx == "d":
            if c == '"':
                stack.pop()
            elif c == "`":
                stack.append("b")
        else:  # u, p, b: unquoted contexts
            if c == "'":
                stack.append("s")
            elif c == '"':
                stack.append("d")
            elif c == "`" and ctx == "b":
                stack.pop()
            elif c == "`":
                stack.append("b")
            elif ctx == "p" and c == "(":
                parens[-1] += 1
            elif ctx == "p" and c == ")":
                if parens[-1] == 0:
                    stack.pop()
                    parens.pop()
                else:
                    parens[-1] -= 1
        out.append(c)
        i += 1
    return "".join(out)
