"""The keys and credentials of one levers9 home's NATS (home/nats/auth/, mode 0700).

One operator, a system account, and one account `LEVERS9` that holds the streams. Users are minted
with the account's signing key (signing.seed): the supervisor mints the admin's and each service's
at `levers9 up`, the pool controller mints each worker's when it provisions it, `levers9 publishers
create` mints a publisher's. Nothing of that needs the server: it trusts any user the account's
signing key signed. Revoking a publisher writes its key into the account JWT's revocations; the
launcher rewrites the server config and reloads the server (`nats-server --signal reload`).

Files: <role>.creds (NATS user), <role>.sign (the role's event-signing seed, bus_signing.py),
signers.json (every role's public signing key, for consumers), publishers.json, server.conf.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from levers9.contracts import uuid7

from . import nats_auth
from . import nats_jwt as J
from .bus_signing import ISSUER_KEY, Signer

ACCOUNT_NAME = "LEVERS9"
SIGNING_ROLES = (nats_auth.ADMIN, *nats_auth.ROLES_SERVICES, nats_auth.WORKER)


@dataclass(frozen=True)
class Publisher:
    id: str
    workspace: str
    user_key: str
    created_at: float
    revoked_at: float = 0.0


def _write_secret(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


class Issuer:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    # ---- keys ----------------------------------------------------------------------------------

    def _seed(self, name: str, kind: str) -> str:
        path = self.dir / f"{name}.seed"
        if not path.exists():
            _write_secret(path, J.new_seed(kind))
        return path.read_text().strip()

    @property
    def ready(self) -> bool:
        return (self.dir / "signers.json").exists()

    def ensure(self) -> None:
        """Create every key and the admin's and services' credentials that are missing; idempotent."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        for name, kind in (("operator", "operator"), ("system", "account"), ("account", "account"),
                           ("signing", "account")):
            self._seed(name, kind)
        signers: dict[str, str] = {}
        for role in SIGNING_ROLES:
            path = self.signing_path(role)
            if not path.exists():
                _write_secret(path, Signer(role, J.new_seed("user")).dump())
            signers[role] = J.public_key(Signer.load(path).seed)
        for role in (nats_auth.ADMIN, *nats_auth.ROLES_SERVICES):
            if not self.creds_path(role).exists():
                perms = (nats_auth.admin_permissions() if role == nats_auth.ADMIN
                         else nats_auth.service_permissions(role))
                _write_secret(self.creds_path(role), self.mint(role, perms)[0])
        # the key that issues every user: consumers check a container report's sender against it
        signers[ISSUER_KEY] = J.public_key(self._seed("signing", "account"))
        (self.dir / "signers.json").write_text(json.dumps(signers, indent=1))

    def creds_path(self, role: str) -> Path:
        return self.dir / f"{role}.creds"

    def signing_path(self, role: str) -> Path:
        return self.dir / f"{role}.sign"

    @property
    def signers_path(self) -> Path:
        return self.dir / "signers.json"

    @property
    def account_key(self) -> str:
        return J.public_key(self._seed("account", "account"))

    # ---- users ---------------------------------------------------------------------------------

    def mint(self, tag: str, permissions: dict[str, Any]) -> tuple[str, str]:
        """(creds text, user public key) of a new user named `tag` with these permissions."""
        seed = J.new_seed("user")
        user_key = J.public_key(seed)
        token = J.user_jwt(self._seed("signing", "account"), self.account_key, user_key, tag, permissions)
        return J.creds(token, seed), user_key

    def worker_creds(self, worker_id: str) -> Path:
        """Credentials for one worker, written to workers/<id>.creds (minted anew each time)."""
        text, _ = self.mint(nats_auth.worker_tag(worker_id), nats_auth.worker_permissions(worker_id))
        path = self.dir / "workers" / f"{worker_id}.creds"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        _write_secret(path, text)
        return path

    # ---- publishers ----------------------------------------------------------------------------

    def publishers(self) -> list[Publisher]:
        path = self.dir / "publishers.json"
        return [Publisher(**p) for p in json.loads(path.read_text())] if path.exists() else []

    def _save_publishers(self, pubs: list[Publisher]) -> None:
        _write_secret(self.dir / "publishers.json", json.dumps([asdict(p) for p in pubs], indent=1))

    def create_publisher(self, workspace: str) -> tuple[Publisher, str]:
        """A new publisher of `workspace` and its creds text (shown once; not kept here)."""
        pid = uuid7().replace("-", "")[-12:]
        text, user_key = self.mint(nats_auth.publisher_tag(workspace, pid),
                                   nats_auth.publisher_permissions(workspace, pid))
        pub = Publisher(id=pid, workspace=workspace, user_key=user_key, created_at=time.time())
        self._save_publishers([*self.publishers(), pub])
        return pub, text

    def revoke_publisher(self, publisher_id: str) -> Publisher:
        pubs = self.publishers()
        found = [p for p in pubs if p.id == publisher_id]
        if not found:
            raise KeyError(f"no publisher {publisher_id!r}; `levers9 publishers list` shows them")
        revoked = Publisher(**{**asdict(found[0]), "revoked_at": found[0].revoked_at or time.time()})
        self._save_publishers([revoked if p.id == publisher_id else p for p in pubs])
        return revoked

    # ---- the server ----------------------------------------------------------------------------

    def server_config(self, *, tls_cert: str = "", tls_key: str = "") -> str:
        """The auth part of nats-server's config (the launcher gives address, ports and JetStream
        as flags, which win over the file): the operator, and the two accounts preloaded."""
        operator = self._seed("operator", "operator")
        system_key = J.public_key(self._seed("system", "account"))
        # a revocation covers every JWT of that user issued up to (and including) the second given
        revocations = {p.user_key: int(p.revoked_at) + 1 for p in self.publishers() if p.revoked_at}
        account = J.account_jwt(operator, self.account_key, ACCOUNT_NAME, jetstream=True,
                                signing_keys=[J.public_key(self._seed("signing", "account"))],
                                revocations=revocations)
        # the operator's and the system account's JWTs never change: the server reloads accounts, not operators
        system = self._jwt("system", lambda: J.account_jwt(operator, system_key, "SYS", jetstream=False))
        operator_jwt = self._jwt("operator", lambda: J.operator_jwt(operator, "levers9", system_key))
        lines = [f"operator: {json.dumps(operator_jwt)}",
                 f"system_account: {system_key}", "resolver: MEMORY", "resolver_preload: {",
                 f"  {system_key}: {json.dumps(system)}", f"  {self.account_key}: {json.dumps(account)}", "}"]
        if tls_cert and tls_key:
            lines.append(f"tls {{ cert_file: {json.dumps(tls_cert)}, key_file: {json.dumps(tls_key)} }}")
        return "\n".join(lines) + "\n"

    def _jwt(self, name: str, make: Callable[[], str]) -> str:
        path = self.dir / f"{name}.jwt"
        if not path.exists():
            _write_secret(path, make())
        return path.read_text().strip()

    def write_server_config(self, **kw: Any) -> Path:
        path = self.dir / "server.conf"
        _write_secret(path, self.server_config(**kw))
        return path
