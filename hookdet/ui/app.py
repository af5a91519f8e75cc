"""The web application: Starlette routes, Jinja2 pages, JSON for the charts, the access token.

Pages (each a stable URL): ``/`` runs and searches; ``/run/<root>/<path>`` a run;
``/search/<root>/<path>`` a search; ``/compare?run=<root>/<path>&run=...`` runs side by side.
Each page is rendered whole on the server (Jinja2, autoescaped: whatever a run file holds is
shown as text) and its charts and live parts come from ``/api/...`` as JSON, which the page's
script (``static/ui.js``) asks for again every second, saying what it already has, so only what
is new travels. Charts are Plotly's (its JavaScript is served from the ``plotly`` package: no
CDN). Every route answers GET only; nothing changes on disk.

Off 127.0.0.1 every request needs the server's token (``?token=`` once, then a cookie); on
127.0.0.1 a request must name this machine in its ``Host`` header (no other site reaches the view
through the user's browser). Every answer carries headers that keep other pages out
(:data:`SAFETY_HEADERS`), and secrets in an experiment are shown hidden
(:func:`hookdet.ui.records.redacted`).
"""
from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional

from hookdet.ui import pages
from hookdet.ui.catalog import Catalog, NotServed

HERE = Path(__file__).parent


class BadRequest(Exception):
    """A query the view cannot take (``?log=abc``): a 400 with a line."""
TOKEN_COOKIE = "hookdet_ui_token"


def plotly_js() -> Path:
    """plotly.js as the ``plotly`` package ships it."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


class Views:
    """Each route's handler: a page rendered whole, or the JSON of what is new on it."""

    def __init__(self, catalog: Catalog) -> None:
        from jinja2 import Environment, FileSystemLoader, select_autoescape

        self.catalog = catalog
        self.reading = threading.Lock()  # the catalog's records are read by one request at a time
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                                     autoescape=select_autoescape(default=True))
        self.static = {"ui.js": HERE / "static" / "ui.js", "ui.css": HERE / "static" / "ui.css",
                       "plotly.min.js": plotly_js()}

    def page(self, name: str, background: Optional[Callable[[], Any]] = None, **values: Any) -> Any:
        """The page ``name`` rendered; ``background``: what to read once it is sent (in a worker
        thread, as every read), so the page's first question finds it read."""
        from starlette.background import BackgroundTask
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import HTMLResponse

        task = None if background is None else BackgroundTask(run_in_threadpool, self.reading_one_at_a_time, background)
        return HTMLResponse(self.templates.get_template(name).render(**values), background=task)

    def reading_one_at_a_time(self, read: Callable[[], Any]) -> Any:
        """``read()`` while no other request reads the catalog's records."""
        with self.reading:
            return read()

    def located(self, request: Any, kind: str) -> Path:
        try:
            return self.catalog.locate(request.path_params["key"], request.path_params["path"], kind)
        except ValueError as error:  # a path no file can have (a NUL byte in it)
            raise NotServed(f"no such {kind}: {error}") from None

    def compared(self, request: Any) -> List[Path]:
        return [self.catalog.locate(*_key_and_path(given), "run") for given in request.query_params.getlist("run")]

    def list_page(self, request: Any) -> Any:
        return self.page("list.html", rows=pages.list_rows(self.catalog))

    def run_page(self, request: Any) -> Any:
        return self.page("run.html", run=pages.run_page(self.catalog, self.located(request, "run")))

    def search_page(self, request: Any) -> Any:
        """The search page, and its trials' validations read as it travels (its script asks for
        them as soon as it runs: a large search's first read has a head start)."""
        path = self.located(request, "search")
        return self.page("search.html", background=self.catalog.search(path).refresh_trials,
                         search=pages.search_page(self.catalog, path))

    def compare_page(self, request: Any) -> Any:
        return self.page("compare.html", compare=pages.compare_page(self.catalog, self.compared(request)))

    def list_api(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"rows": pages.list_rows(self.catalog)})

    def run_api(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        log_count = request.query_params.get("log", "0") or "0"
        if not log_count.isdigit():
            raise BadRequest(f"log={log_count!r}: the number of log lines the page holds, a whole number")
        log_count = int(log_count)
        return JSONResponse(pages.run_updates(self.catalog, self.located(request, "run"), _have(request), log_count,
                                              request.query_params.get("validations", "")))

    def search_api(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        at = request.query_params.get("at") or "best"
        if not (at in ("best", "last") or (at.partition(":")[0] in ("rung", "batch") and
                                           at.partition(":")[2].replace(".", "", 1).isdigit())):
            raise BadRequest(f"at={at!r}: best, last, rung:K or batch:N")
        choice = {"metric": request.query_params.get("metric") or "", "at": at}
        return JSONResponse(pages.search_updates(self.catalog, self.located(request, "search"), _have(request), choice))

    def compare_api(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(pages.compare_updates(self.catalog, self.compared(request), _have(request)))

    def logs_file(self, request: Any) -> Any:
        """The run's whole log, every rank's lines merged by time, as a text file to save."""
        from urllib.parse import quote

        from starlette.responses import PlainTextResponse

        from hookdet.runs.logs import read_lines

        path = self.located(request, "run")
        text = "".join(line + "\n" for line in read_lines(path, keep=self.catalog.run(path).owns))
        return PlainTextResponse(text, headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(path.name + '.log')}"})

    def static_file(self, request: Any) -> Any:
        from starlette.responses import FileResponse

        path = self.static.get(request.path_params["name"])
        if path is None:
            raise NotServed(f"no static file {request.path_params['name']!r}")
        return FileResponse(path, headers={"Cache-Control": "max-age=3600"})


def build_app(catalog: Catalog, token: Optional[str] = None) -> Any:
    """The ASGI application over ``catalog``; with ``token``, every request must carry it."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from starlette.concurrency import run_in_threadpool

    views = Views(catalog)

    def read(handler: Callable[[Any], Any], request: Any) -> Any:
        return views.reading_one_at_a_time(lambda: handler(request))

    def served(handler: Callable[[Any], Any], reads_records: bool = True) -> Callable[[Any], Awaitable[Any]]:
        """The route's endpoint: a handler that reads run files runs in a worker thread, so the
        event loop goes on answering (a static file while a large run is read for the first time)."""
        async def endpoint(request: Any) -> Any:
            try:
                return await run_in_threadpool(read, handler, request) if reads_records else handler(request)
            except NotServed as refusal:
                return PlainTextResponse(f"not found: {refusal}", status_code=404)
            except BadRequest as refusal:
                return PlainTextResponse(f"bad request: {refusal}", status_code=400)
            except pages.DAMAGED as error:  # this run's or search's files; the others are served
                return PlainTextResponse(f"damaged: the files of {request.url.path} cannot be read "
                                         f"({pages.damage_of(error)})", status_code=422)
        return endpoint

    routes = [
        Route("/", served(views.list_page)),
        Route("/run/{key}/{path:path}", served(views.run_page)),
        Route("/search/{key}/{path:path}", served(views.search_page)),
        Route("/compare", served(views.compare_page)),
        Route("/api/list", served(views.list_api)),
        Route("/api/run/{key}/{path:path}", served(views.run_api)),
        Route("/api/search/{key}/{path:path}", served(views.search_api)),
        Route("/api/compare", served(views.compare_api)),
        Route("/logs/{key}/{path:path}", served(views.logs_file)),
        Route("/static/{name}", served(views.static_file, reads_records=False)),
    ]
    app = _with_safety_headers(Starlette(routes=routes))
    return _guarded(app, token) if token else _local_hosts_only(app)


def _key_and_path(given: str) -> List[str]:
    key, _, relative = given.partition("/")
    return [key, relative or "."]


def _have(request: Any) -> Dict[str, List[int]]:
    """What the page already holds: ``{series: [epoch, points]}`` (see :mod:`hookdet.ui.series`)."""
    try:
        have = json.loads(request.query_params.get("have") or "{}")
    except ValueError:
        return {}
    return have if isinstance(have, dict) else {}


#: What every answer says to the browser: run nothing but the view's own scripts, take no part
#: in another site's frames, never guess a type (``Content-Security-Policy``, its frame rule,
#: ``X-Frame-Options``, ``nosniff``). Plotly styles its charts inline and draws images from data URLs.
SAFETY_HEADERS = (
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                 b"img-src 'self' data: blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
#: The names a request's ``Host`` may give when the view listens on this machine only.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def _with_safety_headers(app: Any) -> Any:
    """``app`` with :data:`SAFETY_HEADERS` on every answer."""
    async def with_headers(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        async def send_with_headers(message: Dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + list(SAFETY_HEADERS))
            await send(message)

        await app(scope, receive, send_with_headers if scope["type"] == "http" else send)

    return with_headers


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8080`` -> ``[::1]``)."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def _local_hosts_only(app: Any) -> Any:
    """``app`` answering only requests that name this machine in their ``Host`` header. Another
    name is another site reaching the view through the browser (DNS rebinding): refused, as
    Jupyter, TensorBoard and MLflow refuse it, so no web page the user visits can read the runs."""
    from starlette.responses import PlainTextResponse

    async def local_only(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()
            if host_name(host) not in LOCAL_HOSTS:
                refusal = PlainTextResponse(f"hookdet ui answers requests for {', '.join(LOCAL_HOSTS)} only, not "
                                            f"for {host or 'no Host'}", status_code=403)
                await refusal(scope, receive, send)
                return
        await app(scope, receive, send)

    return local_only


def _guarded(app: Any, token: str) -> Any:
    """``app`` behind the access token: from ``?token=`` (then remembered in a cookie) or the cookie."""
    from starlette.responses import PlainTextResponse, RedirectResponse

    async def guarded(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        from starlette.requests import Request

        request = Request(scope)
        given = request.query_params.get("token")
        if given is not None and secrets.compare_digest(given, token):
            response = RedirectResponse(str(request.url.remove_query_params("token")), status_code=303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            await response(scope, receive, send)
            return
        if not secrets.compare_digest(request.cookies.get(TOKEN_COOKIE, ""), token):
            refusal = PlainTextResponse("this hookdet ui needs its access token: open the URL it printed when it "
                                        "started (…?token=...)", status_code=403)
            await refusal(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded
