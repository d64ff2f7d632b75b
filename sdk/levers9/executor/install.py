"""`python3 -m levers9.executor.install -- REQUIREMENT...`: a function's `packages=`, installed by its
worker in a one-off install container before the sandbox starts (levers9.worker.sandboxes.sandboxes).

That container is tenant code (a setup.py runs in it) with a sandbox's confinement: the sandbox's
image, runc, no capabilities beyond the sandbox's, the seccomp profile, a network namespace whose
one way out is the worker's egress proxy to the package indexes. It installs exactly as the sandbox
would (levers9.executor.packages.ensure, same Python, same key, same marker) into the node's cache
of installs for this workspace and image, bound at the same place; the sandbox then finds the
install and installs nothing. Exit status 0: installed (or nothing to do); 1: pip failed; 2: a
requirement was an option.
"""

from __future__ import annotations

import sys
from pathlib import Path

from levers9.executor import packages

PACKAGES_DIR = "/var/lib/levers9/packages"  # where the worker binds the cache (levers9.runner.config)


def main(argv: list[str], base: Path = Path(PACKAGES_DIR)) -> int:
    requirements = argv[1:] if argv[:1] == ["--"] else argv
    options = [r for r in requirements if r.lstrip().startswith("-")]
    if options:
        print(f"levers9: {options[0]!r} is an option, not a requirement: packages= names projects or URLs")
        return 2
    try:
        installed = packages.ensure(requirements, base, lambda line: print(line, end="", flush=True),
                                    lambda proc: None, lambda: False)
    except packages.InstallFailed as exc:
        print(f"levers9: installing {' '.join(requirements)} failed: {exc}")
        return 1
    print(f"levers9: installed {' '.join(installed)}" if installed else "levers9: the image has every package")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
