"""A remote command's own exit status never becomes specdeck's (the CLI contract: 1 an action
failed, 2 invalid input, 3 host unreachable)."""

import pytest

from core import cli
from core.errors import RemoteCommandFailed


@pytest.mark.parametrize("remote, sig", [(127, None), (0, None), (None, "KILL"), (3, None)])
def test_remote_failure_exits_1_whatever_the_remote_status(monkeypatch, capsys, remote, sig):
    err = RemoteCommandFailed("ct129", "python -m core.ml.eval", remote, "boom\n", signal=sig)
    assert err.remote_status == remote and err.exit_status == 1

    def fails(args):
        raise err

    monkeypatch.setattr(cli, "cmd_kinds", fails, raising=False)
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():
        if action.prog.endswith(" kinds"):
            action.set_defaults(fn=fails)
    assert cli.main(["kinds"]) == 1
    out = capsys.readouterr().err
    assert "ct129" in out and ("signal KILL" if sig else f"exit status {remote}") in out
