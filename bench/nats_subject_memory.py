"""How nats-server's memory follows a stream: its bytes, then its distinct subjects (the server, not levers9).

levers9's log puts each aggregate on subjects of its own (levers9.<ws>.<aggregate>.<id>.<Type>), so
every container, call and deployment adds subjects. JetStream keeps a per-subject index of a stream in
memory. This starts a bare nats-server (the venv's) twice and publishes the same number of 300-byte
messages, once all on one subject and once each on a new one, sampling the server's RSS every 5,000
messages. On one subject the RSS rises with the stream's bytes while its active block fills (the
block's cache, about 8 MiB of messages) and then levels off; the difference between the two runs is
what the subjects cost. bench/soak.py allows nats-server 400 bytes per new subject from this figure.

  python bench/nats_subject_memory.py [--messages 150000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
import psutil

MIB = 1024 * 1024
STEP = 5_000


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run(unique: bool, messages: int, store: Path) -> list[float]:
    port = free_port()
    server = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or "nats-server"
    proc = subprocess.Popen([server, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)  # a bench paces itself: the server starts
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        await js.add_stream(name="LOG", subjects=["levers9.>"])
        rss = [psutil.Process(proc.pid).memory_info().rss / MIB]
        for i in range(messages):
            await js.publish(f"levers9.ws.container.{i if unique else 0}.ContainerStarted", b"x" * 300)
            if (i + 1) % STEP == 0:
                rss.append(psutil.Process(proc.pid).memory_info().rss / MIB)
        await nc.close()
        return rss
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=150_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one = asyncio.run(run(False, args.messages, Path(tmp) / "one"))
        many = asyncio.run(run(True, args.messages, Path(tmp) / "many"))
    print(f"{'messages':>10} {'stream MiB':>11} {'one subject (MiB)':>18} {'a subject each (MiB)':>21}")
    for n, (a, b) in enumerate(zip(one, many, strict=True)):
        print(f"{n * STEP:>10,} {n * STEP * 300 / MIB:>11.1f} {a:>18.1f} {b:>21.1f}")
    settled = 40_000  # past the first block (about 11 MiB of these messages)
    per = (many[-1] - many[settled // STEP] - (one[-1] - one[settled // STEP])) * MIB / (args.messages - settled)
    print(f"\nper distinct subject, past the first {settled:,} messages: {per:.0f} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
