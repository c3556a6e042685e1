# A throwaway PostgreSQL server for tests (Debian's `postgresql` package: initdb and pg_ctl,
# which `make install-test` installs when missing): a new database cluster in a temporary
# folder on a free loopback port, trust authentication for the user `riverlog`, stopped and
# removed afterwards. PostgreSQL refuses to run as root, so as root the folder is given to
# the `postgres` user (Debian's package makes it) and the commands run as that user.
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from contextlib import contextmanager

from compat._servers import free_port

USER = "riverlog"


def binaries() -> str | None:
    """The folder of initdb and pg_ctl: on PATH, else Debian's newest
    /usr/lib/postgresql/<version>/bin; None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(found))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(versions[-1]) if versions else None


def missing() -> str | None:
    """Why no throwaway server can run here (None: it can)."""
    if binaries() is None:
        return "PostgreSQL is not installed (apt-get install postgresql; make install-test)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root and there is no runuser to run PostgreSQL as `postgres`"
    return None


@contextmanager
def postgres():
    """Yield the SQLAlchemy URL (psycopg2) of the ``postgres`` database of a new server."""
    bin_dir = binaries()
    folder = tempfile.mkdtemp(prefix="riverlog-pg-")
    data, sockets = os.path.join(folder, "data"), os.path.join(folder, "run")
    os.makedirs(sockets)
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in (folder, sockets):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()

    def run(*command: str) -> None:
        subprocess.run(as_user + [os.path.join(bin_dir, command[0]), *command[1:]],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=120)

    try:
        run("initdb", "-D", data, "-U", USER, "--auth=trust", "-E", "UTF8")
        run("pg_ctl", "-D", data, "-l", os.path.join(folder, "log"), "-w", "-t", "60",
            "-o", f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1", "start")
        try:
            yield f"postgresql+psycopg2://{USER}@127.0.0.1:{port}/postgres"
        finally:
            run("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
