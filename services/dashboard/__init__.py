"""levers9.dashboard: the web app's backend, a seventh process.

It talks to the platform only as any client may: the gateway's REST API with the signed-in user's
own token (never a database, NATS or another service's schema). It signs browsers in (one-time
tickets from `levers9 dashboard`, or a pasted token) and holds their token sealed in an HttpOnly
cookie; passes read-only calls through to the gateway; composes the overview, a container's
cold-start waterfall and a correlation id's causal chain; fans one gateway event stream per
workspace out to browsers (`/events`); serves an MCP server for agents at `/mcp`; and serves the
built web app (services/dashboard/web/out/).

    service.py      the process: settings, HTTP server, signals (levers9 service dashboard)
    app.py          the FastAPI app: routes put together, auth and CSRF middleware
    sessions.py     sealed session cookies, sign-in tickets, the key under the home
    auth.py         who is calling (cookie or bearer), CSRF and Origin checks
    upstream.py     the gateway client (the user's token on every call)
    routes_*.py     session, pass-through and actions, composed views, /events
    views.py        the overview and a chain as pure functions of what the gateway answered
    waterfall.py    a container's cold start as phases: a pure function of its events
    fanout.py       one upstream event stream per workspace, bounded queues per browser
    mcp_tools.py    the MCP server at /mcp (the official SDK, streamable HTTP)
    site.py         the static export, its sign-in redirect and its 404 page
"""
