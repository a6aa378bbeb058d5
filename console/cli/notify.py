"""``notify``: where notifications go (core.runs.notify) and ``--test``, one message sent now.

The target is the user's (``$SPECDECK_NOTIFY`` or ``~/.config/specdeck/notify``, mode 0600),
never a plan's; what is printed is its scheme and host, never its secret parts.
"""

from __future__ import annotations


def cmd_notify(args) -> int:
    from core.runs import notify

    if args.test:
        print(f"sent a test message to {notify.send_test()}")
        return 0
    found = notify.target()
    if found is None:
        print(f"no notification target: put one Apprise URL in {notify.config_path()} "
              f"(chmod 600) or in ${notify.ENV}; a plan's notify: names what is sent")
        return 0
    url, source = found
    print(f"notifications go to {notify.describe(url)} (from {source}); "
          "`specdeck notify --test` sends one now")
    return 0


def register(add) -> None:
    sp = add("notify", cmd_notify, "where notifications go (an Apprise URL in $SPECDECK_NOTIFY "
             "or ~/.config/specdeck/notify); --test sends one now",
             example="specdeck notify --test")
    sp.add_argument("--test", action="store_true", help="send a test message and say where")
