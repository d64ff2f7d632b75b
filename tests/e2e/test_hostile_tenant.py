"""A hostile tenant, with an ordinary workspace token, against the lane's shared `levers9 up`
stack (`shared_env`, tests/e2e/conftest.py; runc, root).

Each case lives in a module named for what it attacks (`_hostile_*.py`) and is collected here, so
that the cases share one stack: `hostile_env` (workspace `default`, its profile; a case that needs a
second workspace mints its token). Cases that break the stack on purpose (a worker SIGKILLed)
start their own. RELIABILITY.md lists every case with what it now gets.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _e2e import needs_runc

pytestmark = pytest.mark.slow
needs_runc()

APPS = Path(__file__).parent / "apps"


@pytest.fixture(scope="module")
def hostile_env(shared_env):
    return shared_env


# the cases (pytest orders them by their module's file name, then line); a case that disturbs the
# stack on purpose (a worker SIGKILLed) starts a stack of its own
from _hostile_builds import *  # noqa: E402,F401,F403,I001
from _hostile_burst import *  # noqa: E402,F401,F403
from _hostile_control_plane import *  # noqa: E402,F401,F403
from _hostile_fencing import *  # noqa: E402,F401,F403
from _hostile_input import *  # noqa: E402,F401,F403
