"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings as hypothesis_settings

# Properties assert behaviour, never speed: on a 2-core CI machine shared with runc containers a
# single example can take longer than Hypothesis's 200 ms default deadline, which then fails the
# test as flaky. No deadline, here and in every test that does not set its own.
hypothesis_settings.register_profile("levers9", deadline=None)
hypothesis_settings.load_profile("levers9")

# In CI (scripts/test.sh sets LEVERS9_TEST_EXAMPLES) a property runs at most that many examples, even
# where the test asks for more: the bound is what CI can afford, a developer's run keeps the test's own.
EXAMPLES_CAP = int(os.environ.get("LEVERS9_TEST_EXAMPLES") or 0)

# ---- lanes (pytest-xdist) -------------------------------------------------------------------------
# A module's tests share its module-scoped fixtures (a whole stack), so a module is one unit of work
# and goes to one lane whole. Modules that make machine-wide network state another module also asserts
# on (the netns hosts' underlay bridge `levers9hosts`, `l9h-*` namespaces: "down left nothing") are one
# unit together, so they never run at the same time. (xdist's `loadgroup` marks do not reach its
# scheduler under pytest 9: the scheduler is chosen here instead.)
SHARED_UNITS = {"test_e2e_hosts.py": "machine-hosts", "test_e2e_clusters.py": "machine-hosts"}


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    # xdist's loadscope sorts modules by their number of tests unless told not to: the e2e modules
    # (few tests, minutes each) then went last and made the run's tail; the order is ours (LONG_MODULES)
    config.option.loadscopereorder = False

    class ModuleLanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_UNITS.get(path.rsplit("/", 1)[-1], path)

        def _reschedule(self, node) -> None:
            """The next module when this lane is down to its last test (xdist: at most two left). A
            lane runs a test only once it knows the next (or that there is none), so one is the least;
            more tied a long module to a lane still running two long tests while another stood idle."""
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return ModuleLanes(config, log)


# Longest first: a lane takes the next module in collection order when it is free, so a long module
# collected late is a tail the other lanes wait out. Seconds a module took (setup, tests, teardown) in
# a loaded three-lane run on this 2-core machine; a module not named here keeps its place after these
# (e2e, integration, then the unit tier, whose small modules fill the lanes' ends).
LONG_MODULES = {"test_e2e_notebooks.py": 550, "test_hostile_tenant.py": 380, "test_e2e_compose.py": 280,
                "test_checkpoint_runtime.py": 220,
                "test_e2e_dashboard_api.py": 200, "test_faults.py": 200, "test_e2e_catalogue.py": 170,
                "test_e2e_images.py": 160, "test_e2e_tasks.py": 150, "test_e2e_clusters.py": 140,
                "test_e2e_hosts.py": 140, "test_fuzz.py": 130, "test_e2e_wheel.py": 120, "test_e2e_stack.py": 120,
                "test_e2e_secrets.py": 110, "test_e2e_checkpoint.py": 110, "test_e2e_functions.py": 110,
                "test_e2e_autoscaling.py": 100, "test_e2e_endpoints.py": 80, "test_browser_stack.py": 70,
                "test_soak.py": 70, "test_e2e_boxes.py": 60, "test_browser_pages.py": 40}


def pytest_collection_modifyitems(session, config, items):
    def weight(item) -> int:
        name = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        return LONG_MODULES.get(name, 0)

    items.sort(key=weight, reverse=True)  # stable: a module's tests, and the rest, keep their order


def pytest_itemcollected(item):
    _cap_examples(item)


def _cap_examples(item) -> None:
    test = getattr(item, "obj", None)
    current = getattr(test, "_hypothesis_internal_use_settings", None)  # what @given/@settings gave it
    if EXAMPLES_CAP and current is not None and current.max_examples > EXAMPLES_CAP:
        test._hypothesis_internal_use_settings = hypothesis_settings(current, max_examples=EXAMPLES_CAP)

# ---- servers: one NATS, Postgres, S3 and registry for the whole session (levers9.stack) ------------

SERVER_ENV = {"nats_url": "LEVERS9_NATS_URL", "database_url": "LEVERS9_DATABASE_URL",
              "s3_endpoint": "LEVERS9_S3_ENDPOINT", "registry": "LEVERS9_REGISTRY"}
S3_KEY_ENV = {"s3_access_key": "LEVERS9_S3_ACCESS_KEY", "s3_secret_key": "LEVERS9_S3_SECRET_KEY"}


@pytest.fixture(scope="session")
def servers(tmp_path_factory):
    """{"nats_url", "database_url", "s3_endpoint", "registry", "s3_access_key", "s3_secret_key"} of
    real servers (`registry` is the OCI registry's host:port); `database_url` is the admin's (our own
    Postgres's superuser, with this stack's generated password), and the S3 keys the admin's too.

    The servers named by LEVERS9_NATS_URL, LEVERS9_DATABASE_URL, LEVERS9_S3_ENDPOINT and
    LEVERS9_REGISTRY when they are set (CI, docker-compose; when only the registry is not, one is
    started); otherwise our own, started once under a temporary home and stopped at the end of the
    session. The keys are named like the Settings fields they fill.
    """
    from levers9.runtime.config import Settings

    keys = {env: os.environ[env] for env in S3_KEY_ENV.values() if os.environ.get(env)}
    given = {env: os.environ[env] for env in SERVER_ENV.values() if os.environ.get(env)}
    if len(given) == len(SERVER_ENV):
        settings = Settings.load(env={**keys, **given})
        yield {name: getattr(settings, name) for name in (*SERVER_ENV, *S3_KEY_ENV)}
        return

    from levers9.stack import Stack

    home = tmp_path_factory.mktemp("levers9-home")
    # only the S3 keys (and the three servers, all of them) come from the environment: a stray
    # LEVERS9_* must not change what we start
    external = given if set(given) == set(SERVER_ENV.values()) - {"LEVERS9_REGISTRY"} else {}
    settings = Settings.load(env={**keys, **external, "LEVERS9_HOME": str(home)})
    stack = Stack(home, settings)
    try:
        urls = stack.start_servers()
        # our own servers want this stack's generated credentials: the admin's S3 keys (unless S3 is
        # external), and the registry's password for buildah and skopeo (they read REGISTRY_AUTH_FILE)
        admin = stack.admin_credentials()
        keys = {name: getattr(settings, name) if external else admin[name] for name in S3_KEY_ENV}
        if not os.environ.get("LEVERS9_REGISTRY"):
            os.environ["REGISTRY_AUTH_FILE"] = admin["registry_auth_file"]
        yield {**urls, **keys, "registry_auth_file": admin["registry_auth_file"]}
    finally:
        os.environ.pop("REGISTRY_AUTH_FILE", None)
        stack.down()

# ---- end of servers --------------------------------------------------------------------------------
