"""A seeded generator of hostile messages for the event stream: every one is something no
consumer may apply (each is checked against `decode` here before it is sent), and every one
arrives on a subject some consumer reads, so each must end in LEVERS9_DLQ with a reason.

Kinds: random bytes; JSON that is no envelope; envelopes with wrong field types; known events with
wrong body types or missing fields; unknown event types; payloads near NATS's size limit; deeply
nested JSON; invalid UTF-8; valid events on forged subjects (another workspace, another aggregate
id, another event type, a tenant posing as _sys and the other way round)."""

from __future__ import annotations

import json
import random
import uuid
from typing import Callable, Iterator

from levers9.contracts import ContractError, decode, encode, envelope
from levers9.contracts import events as E

# aggregates whose every event some projection reads (levers9.*.<aggregate>.*.*)
AGGREGATES = ("container", "deployment", "token", "image", "checkpoint")
KNOWN = ("ContainerRequested", "ContainerStarted", "ContainerStopRequested", "ContainerReady", "DeploymentCreated",
         "TokenCreated", "ContainerFailed")
Fuzz = tuple[str, bytes, str]  # subject, payload, kind


def _subject(rng: random.Random, tag: str, workspace: str = "default", aggregate: str | None = None,
             event_type: str | None = None) -> str:
    return (f"levers9.{workspace}.{aggregate or rng.choice(AGGREGATES)}.{tag}-{rng.randrange(10**9)}."
            f"{event_type or rng.choice(KNOWN)}")


def _env_doc(rng: random.Random, type_: str, data: object) -> dict:
    return {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "type": type_, "version": 1,
            "occurred_at": "2026-12-04T12:00:00.000000Z", "workspace": "default",
            "correlation_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "causation_id": None,
            "data": data}


def _junk(rng: random.Random, depth: int = 0) -> object:
    pick = rng.randrange(7 if depth < 3 else 4)
    if pick == 0:
        return rng.randrange(-2**70, 2**70)
    if pick == 1:
        return rng.random() * 10**rng.randrange(-5, 300)
    if pick == 2:
        return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(20)))
    if pick == 3:
        return rng.choice([None, True, False, "", [], {}])
    if pick == 4:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["container_id", "cpu_millicores", "x", "data", "type"]): _junk(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def random_bytes(rng: random.Random, tag: str) -> tuple[str, bytes]:
    return _subject(rng, tag), rng.randbytes(rng.randrange(0, 2000))


def not_an_envelope(rng: random.Random, tag: str) -> tuple[str, bytes]:
    return _subject(rng, tag), json.dumps(_junk(rng)).encode()


def wrong_envelope_types(rng: random.Random, tag: str) -> tuple[str, bytes]:
    doc = _env_doc(rng, "ContainerStopRequested", {"container_id": "c1", "reason": "x"})
    doc[rng.choice(list(doc))] = _junk(rng)
    if rng.random() < 0.3:
        del doc[rng.choice(list(doc))]
    return _subject(rng, tag, aggregate="container", event_type="ContainerStopRequested"), json.dumps(doc).encode()


def wrong_body_types(rng: random.Random, tag: str) -> tuple[str, bytes]:
    type_ = rng.choice(KNOWN)
    body = {"container_id": _junk(rng), "cpu_millicores": rng.choice(["lots", -1.5, [], {"a": 1}]),
            "memory_mib": _junk(rng), "worker_id": _junk(rng), "deployment_id": _junk(rng)}
    return _subject(rng, tag, event_type=type_), json.dumps(_env_doc(rng, type_, body)).encode()


def unknown_type(rng: random.Random, tag: str) -> tuple[str, bytes]:
    type_ = rng.choice(["ContainerExploded", "TokenGranted", "Unknown", "X" * 200, "containerrequested"])
    return _subject(rng, tag, event_type=type_[:64]), json.dumps(_env_doc(rng, type_, {"a": 1})).encode()


def huge(rng: random.Random, tag: str) -> tuple[str, bytes]:
    """Up to NATS's default 1 MiB limit: the dead letter carries it too, with its headers."""
    doc = _env_doc(rng, "ContainerRequested", {"container_id": "c", "blob": ""})
    room = (1024 * 1024) - len(json.dumps(doc)) - rng.randrange(64, 4096)
    doc["data"]["blob"] = "x" * room
    return _subject(rng, tag, aggregate="container", event_type="ContainerRequested"), json.dumps(doc).encode()


def deeply_nested(rng: random.Random, tag: str) -> tuple[str, bytes]:
    depth = rng.randrange(1000, 20000)
    return _subject(rng, tag), b'{"id": ' + b"[" * depth + b"]" * depth + b"}"


def bad_utf8(rng: random.Random, tag: str) -> tuple[str, bytes]:
    doc = json.dumps(_env_doc(rng, "ContainerStopRequested", {"container_id": "c", "reason": "@@"})).encode()
    return _subject(rng, tag, aggregate="container", event_type="ContainerStopRequested"), \
        doc.replace(b"@@", rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"]))


def forged_subject(rng: random.Random, tag: str) -> tuple[str, bytes]:
    """A valid event on a subject that is not its own: the subject carries the authority."""
    cid = f"{tag}-{rng.randrange(10**9)}"
    event = rng.choice([E.ContainerStopRequested(container_id=cid, reason="forged"),
                        E.ContainerStarted(container_id=cid, worker_id="w")])
    doc = encode(envelope(event, workspace="default"))
    name = type(event).__name__
    subject = rng.choice([f"levers9.other.container.{cid}.{name}", f"levers9.default.container.{cid}x.{name}",
                          f"levers9.default.container.{cid}.ContainerRequested", f"levers9._sys.container.{cid}.{name}"])
    return subject, doc


def system_posing(rng: random.Random, tag: str) -> tuple[str, bytes]:
    """A _sys event (worker registration) written as a tenant's, on the tenant's subject."""
    doc = json.loads(encode(envelope(E.WorkerRegistered(worker_id=f"{tag}-w", pool="default", cpu_millicores=1000,
                                                        memory_mib=1024, features=[]), workspace="_sys")))
    doc["workspace"] = "default"
    return f"levers9.default.container.{tag}-{rng.randrange(10**9)}.WorkerRegistered", json.dumps(doc).encode()


KINDS: dict[str, Callable[[random.Random, str], tuple[str, bytes]]] = {
    "random bytes": random_bytes, "not an envelope": not_an_envelope, "wrong envelope types": wrong_envelope_types,
    "wrong body types": wrong_body_types, "unknown type": unknown_type, "deeply nested": deeply_nested,
    "invalid utf-8": bad_utf8, "forged subject": forged_subject, "tenant posing as _sys": system_posing}


def fuzz(seed: int, count: int, tag: str, huge_count: int = 20) -> Iterator[Fuzz]:
    """`count` hostile messages (`huge_count` of them near 1 MiB), each one refused by `decode`."""
    rng = random.Random(seed)
    kinds = list(KINDS.items())
    made = 0
    while made < count:
        kind, make = ("huge", huge) if made < huge_count else rng.choice(kinds)
        subject, payload = make(rng, tag)
        try:
            decode(payload, subject)
        except ContractError:
            made += 1
            yield subject, payload, kind
