# The web view's files: the page at `/` (web/index.html, behind the API's basic auth), its
# script and style (`/web/<file>`), and the chart library, plotly.js, served from the
# installed `plotly` package (MIT; plotly/package_data/plotly.min.js) at `/lib/plotly.min.js`.
# Rules: files only, no state and no API (the page reads the management API, same origin);
# nothing the page loads comes from another host; the page works without the chart library
# (404 when `plotly` is not installed: tables only).
from __future__ import annotations

import importlib.util
import os
from typing import Callable

from aiohttp import web

WEB_DIR = os.path.join(os.path.dirname(__file__), "web")
ASSETS = ("view.js", "view.css")  # what /web/ serves besides the page
CACHE = "max-age=3600"


def chart_library() -> str | None:
    """The path of plotly.min.js in the installed ``plotly`` package, None without one."""
    spec = importlib.util.find_spec("plotly")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "package_data", "plotly.min.js")
        if os.path.isfile(path):
            return path
    return None


def add_routes(router: web.UrlDispatcher, guarded: Callable) -> None:
    """Route the page (through ``guarded``, the API's basic auth), its assets and the chart
    library (no credentials needed: they hold no data)."""
    router.add_get("/", guarded(_index))
    router.add_get("/web/{name}", _asset)
    router.add_get("/lib/plotly.min.js", _library)


async def _index(request: web.Request, caller) -> web.StreamResponse:
    return web.FileResponse(os.path.join(WEB_DIR, "index.html"),
                            headers={"Cache-Control": "no-cache"})


async def _asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.FileResponse(os.path.join(WEB_DIR, name), headers={"Cache-Control": "no-cache"})


async def _library(request: web.Request) -> web.StreamResponse:
    path = chart_library()
    if path is None:
        raise web.HTTPNotFound(text="the chart library is not installed (pip install plotly)")
    return web.FileResponse(path, headers={"Cache-Control": CACHE})
