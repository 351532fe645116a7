"""ZeroMQ CURVE keys of the control plane: generate, load, check.

Called by ``laxflow keys generate`` (once, by the operator), by the
coordinator at start (``--curve-keys DIR``) and by every client of it (the
node daemon, ``laxflow status``) through :mod:`laxflow.coordinator.client`.

Layout of a keys directory (files in ZeroMQ's ZPL certificate format, the one
``zmq.auth.load_certificate`` reads; every file mode 0600, the directories
0700)::

    DIR/coordinator.key             the coordinator's public key
    DIR/coordinator.key_secret      the coordinator's key pair (head node only)
    DIR/clients/<name>.key          a client's public key: the coordinator
                                    admits exactly the keys in DIR/clients/
    DIR/clients/<name>.key_secret   that client's key pair (copy to its nodes)

A node needs ``coordinator.key`` and its ``clients/<name>.key_secret``; the
head node needs ``coordinator.key_secret`` and ``clients/*.key``. To revoke a
client, delete its ``clients/<name>.key`` and restart the coordinator.
"""

from __future__ import annotations

import datetime
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from laxflow.errors import UserError

SERVER = "coordinator"
DEFAULT_CLIENT = "client"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _write(path: Path, public: bytes, secret: bytes | None) -> None:
    text = (
        f"#   laxflow ZeroMQ CURVE certificate, generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}\n"
        "metadata\n"
        "curve\n"
        f'    public-key = "{public.decode()}"\n'
        + (f'    secret-key = "{secret.decode()}"\n' if secret else "")
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never replace a key silently
    with os.fdopen(fd, "w") as f:
        f.write(text)


def generate(directory: str | os.PathLike[str], clients: list[str] | None = None) -> list[Path]:
    """Create the coordinator's key pair (if absent) and one pair per client name.

    Existing files are kept: run again with a new client name to add a node
    key. Returns the files written. UserError for a bad name or an existing
    client key."""
    names = clients or [DEFAULT_CLIENT]
    for n in names:
        if not _NAME.match(n):
            raise UserError(f"keys: client name {n!r} must be 1..64 of A-Z a-z 0-9 _ . -")
    root = Path(directory)
    cdir = root / "clients"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        cdir.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{root}: keys: cannot create directory ({exc.strerror or exc})") from None
    written: list[Path] = []
    if not (root / f"{SERVER}.key_secret").exists():
        public, secret = zmq.curve_keypair()
        _write(root / f"{SERVER}.key", public, None)
        _write(root / f"{SERVER}.key_secret", public, secret)
        written += [root / f"{SERVER}.key", root / f"{SERVER}.key_secret"]
    for n in names:
        if (cdir / f"{n}.key").exists() or (cdir / f"{n}.key_secret").exists():
            raise UserError(f"{cdir / n}.key: keys: client {n!r} already exists (delete it first to replace it)")
        public, secret = zmq.curve_keypair()
        _write(cdir / f"{n}.key", public, None)
        _write(cdir / f"{n}.key_secret", public, secret)
        written += [cdir / f"{n}.key", cdir / f"{n}.key_secret"]
    return written


def _load(path: Path, need_secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise UserError(f"{path}: CURVE key file not found (create keys with `laxflow keys generate DIR`)")
    if need_secret and stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise UserError(f"{path}: secret key is readable by others (mode {stat.S_IMODE(path.stat().st_mode):o}); chmod 600 it")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except Exception as exc:  # zmq raises ValueError / OSError / UnicodeDecodeError for bad files
        raise UserError(f"{path}: not a ZeroMQ CURVE certificate ({exc})") from None
    if need_secret and not secret:
        raise UserError(f"{path}: has no secret-key (expected a .key_secret file)")
    if len(public) != 40 or (secret is not None and len(secret) != 40):
        raise UserError(f"{path}: CURVE keys must be 40 Z85 characters")
    return public, secret


@dataclass(frozen=True)
class ServerKeys:
    """What the coordinator binds with."""

    public: bytes
    secret: bytes
    clients_dir: Path  # the public keys it admits

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> "ServerKeys":
        root = Path(directory)
        public, secret = _load(root / f"{SERVER}.key_secret", need_secret=True)
        cdir = root / "clients"
        if not cdir.is_dir() or not any(cdir.glob("*.key")):
            raise UserError(f"{cdir}: no client public keys (*.key): no daemon could connect")
        for p in cdir.glob("*.key"):
            _load(p, need_secret=False)
        assert secret is not None
        return cls(public, secret, cdir)


@dataclass(frozen=True)
class ClientKeys:
    """What a daemon or ``laxflow status`` connects with."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def load(cls, directory: str | os.PathLike[str], name: str = DEFAULT_CLIENT) -> "ClientKeys":
        root = Path(directory)
        server_public, _ = _load(root / f"{SERVER}.key", need_secret=False)
        public, secret = _load(root / "clients" / f"{name}.key_secret", need_secret=True)
        assert secret is not None
        return cls(public, secret, server_public)

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the coordinator (before connect)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server_public
