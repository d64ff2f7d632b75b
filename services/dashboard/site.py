"""The web app: the Next.js static export in services/dashboard/web/out/, served as files.

Pages are HTML files (`/containers/` -> containers/index.html or containers.html; ids travel in the
query string, `/container/?id=…`). Assets (scripts, styles, images) are public: they are the same
for everyone. A page needs a session, except the sign-in page; without one the browser is sent to
`/signin/`. A page that does not exist is the export's 404 page, with status 404. Until the export is
built (scripts/setup.sh), small placeholder pages stand in, so the backend runs and is tested alone.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse

from .auth import NOT_SIGNED_IN, caller
from .routes_session import ensure_csrf_cookie

WEB_OUT = Path(__file__).resolve().parent / "web" / "out"
PUBLIC_PAGES = ("signin", "404")  # pages shown without a session
API_PREFIXES = ("api/", "events", "mcp")

PLACEHOLDERS = {
    "index": "<h1>levers9</h1><p>Signed in. The web app is not built here: <code>scripts/setup.sh</code> builds "
             "<code>services/dashboard/web/out/</code>. The API answers at <a href=\"/api/overview\">/api/overview</a>.</p>",
    "signin": "<h1>Sign in to levers9</h1><p>Run <code>levers9 dashboard</code> for a sign-in link, or paste a token:</p>"
              "<form id=f><input name=token type=password autocomplete=off><button>Sign in</button></form><p id=m></p>"
              "<script>document.getElementById('f').onsubmit=async e=>{e.preventDefault();"
              "const c=(document.cookie.match(/(?:^|; )levers9_csrf=([^;]*)/)||[])[1]||'';"
              "const r=await fetch('/api/session',{method:'POST',headers:{'Content-Type':'application/json',"
              "'X-CSRF-Token':decodeURIComponent(c)},body:JSON.stringify({token:e.target.token.value})});"
              "if(r.ok)location='/';else document.getElementById('m').textContent=(await r.json()).detail};</script>",
    "404": "<h1>Not found</h1><p>No such page. <a href=\"/\">The overview</a>.</p>",
}


def placeholder(name: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><html><head><meta charset=utf-8><title>levers9</title></head><body>"
                        f"{PLACEHOLDERS[name]}</body></html>", status_code=status)


def signin_url(request: Request) -> str:
    """The sign-in page, told where to go back to: a deep link (a container's page sent in chat)
    lands on that page after signing in, not on the overview."""
    back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return "/signin/" if back == "/" else f"/signin/?next={quote(back, safe='')}"


class Site:
    def __init__(self, root: Path = WEB_OUT) -> None:
        self.root = root.resolve()

    @property
    def built(self) -> bool:
        return (self.root / "index.html").is_file()

    def find(self, path: str) -> Path | None:
        """The file for a URL path, never outside the export."""
        rel = path.strip("/")
        for candidate in ((rel or "index.html"), f"{rel}/index.html", f"{rel}.html"):
            p = (self.root / candidate).resolve()
            if p.is_file() and p.is_relative_to(self.root):
                return p
        return None

    def page_name(self, path: str) -> str:
        return path.strip("/").removesuffix(".html").removesuffix("/index") or "index"

    async def serve(self, path: str, request: Request) -> Response:
        if path.startswith(API_PREFIXES):
            if await caller(request) is None:
                return JSONResponse({"detail": NOT_SIGNED_IN}, status_code=401)
            return JSONResponse({"detail": f"no route /{path}"}, status_code=404)
        found = self.find(path) if self.built else None
        if found is not None and found.suffix != ".html":
            immutable = path.startswith("_next/static/")
            return FileResponse(found, headers={"Cache-Control": "public, max-age=31536000, immutable" if immutable
                                                else "no-cache"})
        name = self.page_name(path)
        if name not in PUBLIC_PAGES and await caller(request) is None:
            return RedirectResponse(signin_url(request), status_code=303)
        response: Response
        if found is not None:
            response = FileResponse(found, headers={"Cache-Control": "no-cache"})
        elif not self.built and name in PLACEHOLDERS:
            response = placeholder(name, 404 if name == "404" else 200)
        else:
            response = self.not_found()
        ensure_csrf_cookie(request, response)
        return response

    def not_found(self) -> Response:
        page = self.find("404") if self.built else None
        if page is not None:
            return FileResponse(page, status_code=404, headers={"Cache-Control": "no-cache"})
        return placeholder("404", 404)
