"""The pure decisions of a proxied WebSocket (levers9.runtime.ws_rules): hostile cases first — the
caller's credentials and the dashboard's session never reach the container, a cookie-authenticated
upgrade from another site is refused, a message over the limit closes both sides with 1009, a code
that may not be sent is never sent — then the ordinary close, idle and kind rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.runtime.ws_rules import (
    Closing,
    Ending,
    closing,
    cross_site_upgrade,
    forwarded_headers,
    handshake_refusal,
    idle_left,
    kind_refusal,
    over_limit,
    sendable,
    short_reason,
    subprotocols,
    without_cookies,
)

SESSION = frozenset({"levers9_session", "levers9_csrf"})


# ---- hostile --------------------------------------------------------------------------------------------

def test_the_callers_token_and_the_upgrades_own_headers_never_reach_the_container():
    headers = [("Authorization", "Bearer l9_secret"), ("Proxy-Authorization", "x"), ("Host", "gw"),
               ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Key", "k"),
               ("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Extensions", "permessage-deflate"),
               ("Sec-WebSocket-Protocol", "chat"), ("X-App", "1"), ("Origin", "http://page")]
    assert forwarded_headers(headers) == {"X-App": "1", "Origin": "http://page"}


def test_the_dashboards_session_cookie_never_reaches_the_container():
    headers = [("Cookie", "levers9_session=sealed; theme=dark; levers9_csrf=c")]
    assert forwarded_headers(headers, SESSION) == {"Cookie": "theme=dark"}
    assert forwarded_headers([("Cookie", "levers9_session=sealed")], SESSION) == {}


@given(st.lists(st.sampled_from(["levers9_session=a", "levers9_csrf=b", "x=1", " y = 2", "levers9_session2=c"]),
                max_size=6))
def test_no_session_cookie_survives_whatever_the_header(parts):
    kept = without_cookies("; ".join(parts), SESSION)
    names = {p.partition("=")[0].strip() for p in kept.split(";") if p.strip()}
    assert not names & SESSION
    assert names == {p.partition("=")[0].strip() for p in parts} - SESSION


@pytest.mark.parametrize("origin, own, refused", [
    ("http://dash:8080", "http://dash:8080", False),
    ("http://evil.example", "http://dash:8080", True),
    ("http://dash:8080.evil", "http://dash:8080", True),
    ("null", "http://dash:8080", True),
    (None, "http://dash:8080", True),
])
def test_a_cookie_upgrade_from_another_site_is_refused(origin, own, refused):
    assert bool(cross_site_upgrade(origin, own)) is refused


def test_a_message_over_the_limit_closes_both_sides_with_1009():
    assert over_limit(b"x" * 11, 10) and not over_limit(b"x" * 10, 10) and not over_limit(b"x" * 10**6, 0)
    assert over_limit("é" * 6, 10)  # text counts its UTF-8 bytes
    plan = closing(Ending("too big", 1009, side="client"), limit=10)
    assert plan.client is not None and plan.upstream is not None
    assert plan.client[0] == plan.upstream[0] == 1009 and "over the limit of 10 bytes" in plan.client[1]
    assert "the container sent" in closing(Ending("too big", side="upstream"), limit=10).client[1]


@given(st.integers(-10, 70000))
def test_a_code_that_may_not_be_sent_is_never_sent(code):
    sent = sendable(code)
    assert sent in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014) or 3000 <= sent <= 4999
    assert sendable(1005) == sendable(None) == 1000 and sendable(1006) == 1011 and sendable(1015) == 1011


@given(st.text(max_size=200))
def test_a_close_reason_fits_a_close_frame(text):
    cut = short_reason(text)
    assert len(cut.encode()) <= 123 and text.startswith(cut)


def test_only_asgi_realtime_and_box_deployments_take_a_websocket():
    assert kind_refusal("asgi", "a") == kind_refusal("realtime", "r") == kind_refusal("box", "b") == ""
    assert "answers HTTP only" in kind_refusal("endpoint", "hello")
    assert "takes no WebSocket" in kind_refusal("function", "f")


def test_the_apps_own_refusal_stands_and_anything_else_is_the_containers_failure():
    assert [handshake_refusal(s) for s in (403, 404, 426, 500, 503, 200, 302)] == [403, 404, 426, 502, 502, 502, 502]


# ---- closing, idle --------------------------------------------------------------------------------------

def test_closing_either_side_closes_the_other_with_its_code():
    assert closing(Ending("client", 4001, "bye")) == Closing(None, (4001, "bye"))
    assert closing(Ending("client", None)) == Closing(None, (1000, ""))
    assert closing(Ending("upstream", 1006)) == Closing((1011, ""), None)
    assert closing(Ending("upstream", 1000, "done")) == Closing((1000, "done"), None)


def test_an_idle_connection_is_closed_with_1001_after_the_timeout():
    assert idle_left(100.0, 130.0, 60) == 30.0 and idle_left(100.0, 161.0, 60) == -1.0
    assert idle_left(100.0, 10**9, 0) is None  # 0: never
    plan = closing(Ending("idle"), idle_s=60)
    assert plan.client == plan.upstream == (1001, "no message either way for 60 s")


def test_subprotocols_offered_in_one_header_or_several():
    assert subprotocols([("Sec-WebSocket-Protocol", "a, b"), ("sec-websocket-protocol", "c"), ("X", "d")]) == \
        ["a", "b", "c"]
