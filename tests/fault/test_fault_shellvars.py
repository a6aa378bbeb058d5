"""Class 7: ``${var}`` in shell text is safe in every quoting context: a value's ``$(...)``,
backticks, quotes, backslashes and globs arrive literally and never execute."""

from __future__ import annotations

import json

from tests.fault.conftest import cli, local_plan

VALUES = [
    "$(touch PWNED1)",
    "`touch PWNED2`",
    "it's \"quoted\" \\ and * ?",
    "'; touch PWNED3; echo '",
    "\"; touch PWNED4; echo \"",
    "$HOME ${HOME} $((1+1))",
    "new\nline",
]
CONTEXTS = [
    ("unquoted", "printf '<%s>\\n' ${v}"),
    ("double", 'printf "<%s>\\n" "${v}"'),
    ("single", "printf '<%s>\\n' '${v}'"),
    ("double-in-subst", 'printf "<%s>\\n" "$(printf %s "${v}")"'),
    ("subst-in-double", 'printf "<%s>\\n" "$(printf %s ${v})"'),
    ("backticks", 'printf "<%s>\\n" "`printf %s ${v}`"'),
    ("ansi-c", "printf '<%s>\\n' $'${v}'"),
    ("mid-word", "printf '<%s>\\n' x${v}y"),
]


def test_vars_arrive_literally_in_every_context(tmp_path):
    variables = {f"v{i}": v for i, v in enumerate(VALUES)}
    items = "".join(f"""  - id: {name}
    content: {name}
    action: {{kind: shell, host: here, params: {{command: {json.dumps(
        "; ".join(cmd.replace("${v}", "${v%d}" % i) for i in range(len(VALUES))))}}}}}
""" for name, cmd in CONTEXTS)
    plan = local_plan(tmp_path, items, vars_=json.dumps(variables))
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "--all", "-q")
    assert res.returncode == 0, res.stderr
    for name, _ in CONTEXTS:
        out = cli("--state", db, "logs", plan, name).stdout
        expect = "".join(f"<{'x' + v + 'y' if name == 'mid-word' else v}>\n" for v in VALUES)
        assert out == expect, (name, out)
    assert not list(tmp_path.rglob("PWNED*"))
