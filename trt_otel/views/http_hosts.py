"""Which ``Host`` headers name the HTTP view's server, against DNS rebinding.

A web page on another site that points its own name at the view's address sends that name in
its requests' ``Host`` header; the view answers only the address it serves on (an IP literal,
any port), ``localhost`` and the names the user allowed (``--http-allowed-host``), so such a page
is answered 421 with nothing of the build.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence


class HostCheck:
    """Which ``Host`` headers name this server: the address it serves on (any IP literal when
    it serves on every interface: an IP cannot be rebound to another site), ``localhost``, and
    the names the user allowed. Any port: a tunnel (``ssh -L``) changes it."""

    def __init__(self, address: str, allowed: Sequence[str] = ()) -> None:
        self.names = {"localhost", *(_canonical(name) for name in allowed)}
        self.ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
        self.any_ip = False
        try:
            self.ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            self.names.add(_canonical(address))  # served on a name: that name
        else:
            self.any_ip = self.ip.is_unspecified

    def accepts(self, header: str | None) -> bool:
        name = _host_name(header) if header is not None else None
        if name is None:
            return False
        if name in self.names:
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        return self.any_ip or ip == self.ip


def _canonical(name: str) -> str:
    return name.strip().lower().removesuffix(".")


def _host_name(header: str) -> str | None:
    """The name a ``Host`` header gives, without its port (and an IPv6 literal's brackets);
    None when it is no ``host[:port]``."""
    value = header.strip()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    return _canonical(name) or None
