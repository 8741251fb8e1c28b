"""``--web.config.file``: TLS, basic auth and response headers in the Prometheus exporter-toolkit format.

The file is the one every Go exporter reads (``tls_server_config``, ``http_server_config``,
``basic_auth_users``); relative paths are relative to the file. :func:`load` checks everything,
certificates included, and raises :class:`WebConfigError` with a one-line message, so a file that
loads is a file that serves.
"""

from __future__ import annotations

import hashlib
import re
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml


class WebConfigError(Exception):
    """A web config file that cannot be used; the message is one line, shown as is."""


# The headers exporter-toolkit lets a config set, with their allowed values (None: any value).
ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3,
}

# client_auth_type -> (verify mode, needs client_ca_file). Python's ssl module verifies every client
# certificate it asks for, so RequireAnyClientCert verifies against client_ca_file too, and
# RequestClientCert (asked for, never checked, never used here) grants what NoClientCert grants.
CLIENT_AUTH = {
    "NoClientCert": (ssl.CERT_NONE, False),
    "RequestClientCert": (ssl.CERT_NONE, False),
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, True),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}

_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "prefer_server_cipher_suites"}
_UNSUPPORTED_TLS_KEYS = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences", "client_allowed_sans"}
_HTTP_KEYS = {"headers", "http2"}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
_BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")
# exporter-toolkit's stand-in for unknown users, so a wrong name costs as much as a wrong password.
_FAKE_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


@dataclass(frozen=True)
class WebConfig:
    """What the HTTP server applies to every request; the default is plain HTTP, no auth."""

    tls_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    path: str | None = None
    _cache: "_AuthCache" = field(default_factory=lambda: _AuthCache(), compare=False, repr=False)

    def check_password(self, user: str, password: str) -> bool:
        """True if ``user`` has ``password``; a verified pair is cached, so scrapes skip bcrypt."""
        if not self.users:
            return True
        hashed = self.users.get(user)
        name = user.encode("utf-8", "surrogatepass")
        key = hashlib.sha256(len(name).to_bytes(8, "big") + name + password.encode("utf-8", "surrogatepass")).digest()
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._cache.bcrypt_lock:  # bcrypt is CPU-bound: one at a time
            try:
                ok = bcrypt.checkpw(password.encode("utf-8", "surrogatepass"), hashed or _FAKE_HASH)
            except ValueError:
                ok = False
        ok = ok and hashed is not None
        self._cache.set(key, ok)
        return ok

    def describe(self) -> str:
        parts = [f"TLS {'on' if self.tls_context else 'off'}",
                 f"basic auth {'on (%d users)' % len(self.users) if self.users else 'off'}"]
        if self.headers:
            parts.append("headers " + ", ".join(sorted(self.headers)))
        return "; ".join(parts)


class _AuthCache:
    """The last ``size`` (user, password) checks, keyed by a digest, never the password itself."""

    def __init__(self, size: int = 100):
        self.size = size
        self.bcrypt_lock = threading.Lock()
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, bool] = OrderedDict()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
            return self._items.get(key)

    def set(self, key: bytes, value: bool) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def load(path: str | None) -> WebConfig:
    """The web config in ``path`` (None or "": plain HTTP, no auth); WebConfigError if unusable."""
    if not path:
        return WebConfig()
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise WebConfigError(f"cannot read web config file {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"web config file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    try:
        return _parse(data or {}, Path(path).parent, path)
    except WebConfigError as exc:
        raise WebConfigError(f"web config file {path}: {exc}") from None


def _parse(data: Any, base: Path, path: str) -> WebConfig:
    top = _mapping(data, "the file", _TOP_KEYS)
    tls = _mapping(top.get("tls_server_config"), "tls_server_config", _TLS_KEYS, _UNSUPPORTED_TLS_KEYS)
    http = _mapping(top.get("http_server_config"), "http_server_config", _HTTP_KEYS)
    headers = _headers(_mapping(http.get("headers"), "http_server_config.headers", None))
    for section, flag in ((http, "http2"), (tls, "prefer_server_cipher_suites")):  # accepted, no effect here
        if not isinstance(section.get(flag, True), bool):
            raise WebConfigError(f"{flag} must be true or false, not {section[flag]!r}")
    users = {}
    for user, hashed in _mapping(top.get("basic_auth_users"), "basic_auth_users", None).items():
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            raise WebConfigError(f"basic_auth_users: the password of {user!r} is not a bcrypt hash "
                                 "(make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        users[str(user)] = hashed.encode()
    return WebConfig(tls_context=_tls_context(tls, base) if tls else None, users=users, headers=headers,
                     path=path)


def _mapping(value: Any, where: str, allowed: set | None, unsupported: set | frozenset = frozenset()) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping, not {type(value).__name__}")
    for key in value:
        if key in unsupported:
            raise WebConfigError(f"{where}.{key} is not supported by this exporter")
        if allowed is not None and key not in allowed:
            raise WebConfigError(f"unknown setting {key!r} in {where}")
    return value


def _headers(headers: dict) -> dict[str, str]:
    checked = {}
    for name, value in headers.items():
        if name not in ALLOWED_HEADERS:
            raise WebConfigError(f"HTTP header {name!r} can not be configured; one of {', '.join(ALLOWED_HEADERS)}")
        value = "" if value is None else str(value)
        allowed = ALLOWED_HEADERS[name]
        if allowed and value not in allowed:
            raise WebConfigError(f"invalid value {value!r} for {name}; one of {', '.join(allowed)}")
        if "\r" in value or "\n" in value:
            raise WebConfigError(f"header {name} has a line break")
        if value:  # blank means unset, as in exporter-toolkit
            checked[name] = value
    return checked


def _tls_context(tls: dict, base: Path) -> ssl.SSLContext:
    def file(key: str) -> str | None:
        value = tls.get(key)
        return None if value in (None, "") else str(base / str(value))

    cert, key, client_ca = file("cert_file"), file("key_file"), file("client_ca_file")
    if cert is None:
        raise WebConfigError("tls_server_config needs cert_file")
    if key is None:
        raise WebConfigError("tls_server_config needs key_file")
    auth = tls.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"invalid client_auth_type {auth!r}; one of {', '.join(CLIENT_AUTH)}")
    verify_mode, needs_ca = CLIENT_AUTH[auth]
    if client_ca and auth == "NoClientCert":
        raise WebConfigError("client_ca_file is set but client_auth_type is NoClientCert")
    if needs_ca and not client_ca:
        raise WebConfigError(f"client_auth_type {auth} needs client_ca_file")
    for name, value in (("cert_file", cert), ("key_file", key), ("client_ca_file", client_ca)):
        try:
            if value is not None:
                Path(value).read_bytes()
        except OSError as exc:
            raise WebConfigError(f"cannot read {name} {value}: {exc.strerror or exc}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(tls, "min_version", "TLS12")
    context.maximum_version = _version(tls, "max_version", "TLS13")
    if context.minimum_version > context.maximum_version:
        raise WebConfigError("min_version is above max_version")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"cannot load cert_file {cert} with key_file {key}: {_ssl_reason(exc)}") from None
    context.verify_mode = verify_mode
    if client_ca and verify_mode != ssl.CERT_NONE:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"cannot load client_ca_file {client_ca}: {_ssl_reason(exc)}") from None
    return context


def _version(tls: dict, key: str, default: str) -> ssl.TLSVersion:
    name = tls.get(key) or default
    if name not in TLS_VERSIONS:
        raise WebConfigError(f"invalid {key} {name!r}; one of {', '.join(TLS_VERSIONS)}")
    return TLS_VERSIONS[name]


def _ssl_reason(exc: Exception) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
