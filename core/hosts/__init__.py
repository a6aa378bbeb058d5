"""Hosts: where commands run and files live.

One interface (:class:`~core.hosts.base.Host`), two implementations: :class:`LocalHost`
(the console machine) and ``SSHHost`` (``core.hosts.ssh``, the only importer of asyncssh,
imported lazily so that a plan with only local hosts never loads it).
"""

from core.hosts.base import (
    CommandResult,
    FileStat,
    Host,
    HostState,
    HostStatus,
)
from core.hosts.local import LocalHost

__all__ = ["CommandResult", "FileStat", "Host", "HostState", "HostStatus", "LocalHost", "make_host"]


def make_host(name: str, spec, base_dir=None) -> Host:
    """Build the Host for a plan's host spec (``core.plans.plan.HostSpec``).

    A local host's relative workdir is taken relative to ``base_dir`` (the plan's folder).
    """
    if spec.local:
        import os

        wd = spec.workdir
        if base_dir is not None and not wd.startswith(("/", "~")):
            wd = os.path.normpath(os.path.join(str(base_dir), wd))
        return LocalHost(name, workdir=wd, python=spec.python, env=spec.env)
    from core.hosts.ssh import SSHHost  # lazy: asyncssh only when a plan has an ssh host

    return SSHHost(name, target=spec.ssh, workdir=spec.workdir, python=spec.python, env=spec.env)
