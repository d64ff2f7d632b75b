"""How one process shows itself on the bus: its NATS credentials, its inbox, and its event keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import nats_auth, nats_jwt
from .bus_signing import Reporter, Signer, Verifier

if TYPE_CHECKING:
    from .config import Settings


@dataclass(frozen=True)
class BusAuth:
    creds: str = ""  # a .creds file: user JWT + nkey seed
    signer: Signer | None = None  # signs the power events this process owns
    verifier: Verifier | None = None  # checks the power events this process consumes
    reporter: Reporter | None = None  # a worker: signs its container reports as itself (its NATS user)

    @classmethod
    def from_settings(cls, s: Settings) -> "BusAuth":
        """The process's own settings; the CLI (no `service`) of a home whose NATS runs with auth
        acts as that home's admin (whoever can read the home holds its keys anyway)."""
        creds, signing, signers = s.bus.creds, s.bus.signing_key, s.bus.signers
        admin = Path(s.bus.issuer or Path(s.home or ".") / "nats" / "auth")
        if not creds and not s.process.service and (admin / "admin.creds").exists():
            creds, signing, signers = str(admin / "admin.creds"), str(admin / "admin.sign"), str(admin / "signers.json")
        return cls(creds=creds, signer=Signer.load(signing) if signing else None,
                   verifier=Verifier.load(signers) if signers else None,
                   reporter=Reporter.from_creds(creds) if creds and s.process.service == "worker" else None)

    def connect_options(self) -> dict[str, Any]:
        """nats.connect() keywords: the credentials and the inbox prefix the user may subscribe to."""
        if not self.creds:
            return {}
        name = nats_jwt.decode(nats_jwt.creds_jwt(Path(self.creds).read_text()))["name"]
        return {"user_credentials": self.creds, "inbox_prefix": nats_auth.inbox_prefix(name)}
