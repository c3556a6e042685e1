# Liftbridge's ids: the server id (``clustering.server.id``, else generated once and kept in
# DATA/liftbridge-server-id, so a restarted server is the same member) and the random ids it
# names ack inboxes with (as NATS's NUID: 22 characters, base 62). Rules: the id file is
# written atomically (a crash leaves the old file or the new one, never half of one).
from __future__ import annotations

import os
import secrets

__all__ = ["SERVER_ID_FILE", "load_server_id", "new_id"]

SERVER_ID_FILE = "liftbridge-server-id"


def new_id() -> str:
    """A random id like NATS's NUID (22 characters, base 62)."""
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return "".join(secrets.choice(alphabet) for _ in range(22))


def load_server_id(data_dir: str, configured: str | None) -> str:
    """The server id: ``configured`` if given, else the one kept in DATA/liftbridge-server-id
    (generated and saved on first use). Raises OSError when the folder cannot be written."""
    if configured:
        return configured
    path = os.path.join(data_dir, SERVER_ID_FILE)
    try:
        with open(path) as f:
            saved = f.read().strip()
        if saved:
            return saved
    except FileNotFoundError:
        pass
    server_id = new_id()
    os.makedirs(data_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(server_id + "\n")
    os.replace(path + ".tmp", path)
    return server_id
