"""URLs as they are shown, and the credentials a URL carries.

A URL given on the command line may carry a user and password (``https://ci:s3cret@push.example``),
the way Prometheus' and curl's users write them. What trt-otel prints of such a URL (a warning, a
policy's description, a startup line) never shows the password; a caller that needs them takes
them apart with :func:`credentials`.
"""

from __future__ import annotations

import urllib.parse

HIDDEN = "***"
"""What a URL's password is shown as."""


def shown(url: str) -> str:
    """``url`` with its password (if any) replaced by :data:`HIDDEN`; the user stays, as it says
    which account was used. A string that is not a URL is returned as it came."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:  # a port that is not a number: nothing to take a password from
        return url
    if password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{HIDDEN}@{host}"))


def credentials(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its user and password, and those two (percent-decoded; None where
    absent)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), user, password
