"""The live web page of a build, served by its HTTP view at ``/``.

The page is three static files shipped inside the package (no CDN, no build step): it follows
``/events`` and reads ``/status``, so it shows the same read model as the terminal. The answers
carry a Content-Security-Policy that allows only the view's own scripts and styles: even if a
string from the build (a phase name, a cancel reason) were ever put into the page as markup, it
could not run.
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass

__all__ = ["PAGE_HEADERS", "Asset", "asset"]

PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

_ROUTES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/assets/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/assets/style.css": ("style.css", "text/css; charset=utf-8"),
}


@dataclass(frozen=True, slots=True)
class Asset:
    content_type: str
    body: bytes


def asset(path: str) -> Asset | None:
    """The file served at ``path`` (without its query), or None when there is none."""
    route = _ROUTES.get(path)
    if route is None:
        return None
    return _load(*route)


@functools.cache
def _load(name: str, content_type: str) -> Asset:
    body = importlib.resources.files(__name__).joinpath("static", name).read_bytes()
    return Asset(content_type, body)
