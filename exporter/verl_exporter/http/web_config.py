"""``--web.config.file``: TLS, basic auth and response headers in the Prometheus exporter-toolkit format.

The file is the one every Go exporter reads (``tls_server_config``, ``http_server_config``,
``basic_auth_users``); relative paths are relative to the file. :func:`load` checks everything,
certificates included, and raises :class:`WebConfigError` with a one-line message, so a file that
loads is a file that serves.

Reading is bounded: the file and the certificate, key and CA files it names must be regular files
(a FIFO or ``/dev/zero`` is refused without being read) of a bounded size, and YAML aliases are
refused. An error names the key, the line and the column, never the file's text: a web config path
that points at a secret must not copy the secret into the log.
"""

from __future__ import annotations

import hashlib
import re
import ssl
import threading
from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from verl_exporter.config.bounded_files import FileTooLarge, NotRegularFile, read_regular_file
from verl_exporter.config.yaml_files import AliasRefused, NoAliasLoader


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
MAX_WEB_CONFIG_BYTES = 256 * 1024
MAX_PEM_BYTES = 4 * 1024 * 1024  # a certificate chain, a key or a CA bundle
# What each empty section turns off when the file writes it on purpose (``{}``, not a null left behind
# by commented-out lines); a reload that would turn TLS or basic auth off needs it (see reload.py).
OFF_ON_PURPOSE = {"tls_server_config": "TLS", "basic_auth_users": "basic auth"}
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
    # The sections the file sets to ``{}`` on purpose, and "client_auth_type" when the file states it.
    stated: frozenset[str] = frozenset()
    _cache: "_AuthCache" = field(default_factory=lambda: _AuthCache(), compare=False, repr=False)

    def check_password(self, user: str, password: str) -> bool:
        """True if ``user`` has ``password``. A verified pair is kept (failures never push it out,
        and a reload that keeps the user's hash keeps it: ``keep_verified``), so scrapes skip
        bcrypt; bcrypt runs one check at a time with at most ``BCRYPT_SLOTS`` waiting, and a check
        past them is refused at once (False, not remembered). An unknown user costs a bcrypt of the
        cost of one of the users' hashes, the same one for the same name, so a wrong name takes as
        long as a wrong password of some user. Only a password's first 72 bytes count, as bcrypt,
        htpasswd and Go's exporter-toolkit take them."""
        if not self.users:
            return True
        key = self._cache.key(user, password)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if not self._cache.slots.acquire(blocking=False):
            return False  # bcrypt is busy with a queue of checks already: refuse, do not wait
        try:
            with self._cache.bcrypt_lock:  # bcrypt is CPU-bound: one at a time
                cached = self._cache.get(key)  # verified while this one waited
                if cached is not None:
                    return cached
                hashed = self.users.get(user)
                try:
                    ok = bcrypt.checkpw(password.encode("utf-8", "surrogatepass")[:BCRYPT_MAX_BYTES],
                                        hashed or self._cache.dummy_hash(self.users, user))
                except ValueError:
                    ok = False
        finally:
            self._cache.slots.release()
        ok = ok and hashed is not None
        self._cache.set(key, ok, user)
        return ok

    def keep_verified(self, before: "WebConfig") -> None:
        """Take the pairs ``before`` (the config this one replaces) verified, of the users whose hash
        is the same here: a reload does not send every scrape back to bcrypt, where a flood of wrong
        passwords would keep them waiting."""
        self._cache.adopt(before._cache, {user for user, hashed in self.users.items()
                                          if before.users.get(user) == hashed})

    @property
    def authenticates(self) -> bool:
        """Whether every request is authenticated: basic auth, or a verified client certificate."""
        return bool(self.users) or (self.tls_context is not None and self.tls_context.verify_mode == ssl.CERT_REQUIRED)

    def cached_password(self, user: str, password: str) -> bool | None:
        """What :meth:`check_password` would answer without running bcrypt: True or False when
        this pair was checked before, None when it needs bcrypt."""
        if not self.users:
            return True
        return self._cache.get(self._cache.key(user, password))

    def describe(self) -> str:
        parts = [f"TLS {'on' if self.tls_context else 'off'}",
                 f"basic auth {'on (%d users)' % len(self.users) if self.users else 'off'}"]
        if self.headers:
            parts.append("headers " + ", ".join(sorted(self.headers)))
        return "; ".join(parts)


BCRYPT_SLOTS = 4  # bcrypt checks running or waiting at once; more are refused without one
BCRYPT_MAX_BYTES = 72  # of a password, that bcrypt reads


class _AuthCache:
    """Checked (user, password) pairs, keyed by a digest, never the password itself: up to
    ``size`` verified pairs and, apart from them, up to ``failures`` refused ones, each kept
    least recently used first, so a flood of wrong passwords cannot push a good one out."""

    def __init__(self, size: int = 100, failures: int = 1000):
        self.size, self.failures = size, failures
        self.bcrypt_lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(BCRYPT_SLOTS)
        self._lock = threading.Lock()
        # checked pairs by outcome; a verified pair's value is its user (kept across reloads by it)
        self._items: dict[bool, OrderedDict[bytes, str]] = {True: OrderedDict(), False: OrderedDict()}
        self._dummies: dict[int, bytes] = {}

    @staticmethod
    def key(user: str, password: str) -> bytes:
        name = user.encode("utf-8", "surrogatepass")
        return hashlib.sha256(len(name).to_bytes(8, "big") + name + password.encode("utf-8", "surrogatepass")).digest()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            for value, items in self._items.items():
                if key in items:
                    items.move_to_end(key)
                    return value
            return None

    def set(self, key: bytes, value: bool, user: str = "") -> None:
        with self._lock:
            items = self._items[value]
            items[key] = user
            while len(items) > (self.size if value else self.failures):
                items.popitem(last=False)

    def adopt(self, other: "_AuthCache", users: Container[str]) -> None:
        """The pairs ``other`` verified for ``users``."""
        with other._lock:
            kept = list(other._items[True].items())
        for key, user in kept:
            if user in users:
                self.set(key, True, user)

    def dummy_hash(self, users: dict[str, bytes], name: str) -> bytes:
        """A hash no password matches, for an unknown user ``name``: of the cost of one of ``users``'
        hashes, picked by the name (the same name, the same cost; one cost when all users share it)."""
        costs = sorted(int(hashed.split(b"$")[2]) for hashed in users.values()) or [10]
        cost = costs[int.from_bytes(hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()[:4], "big")
                     % len(costs)]
        with self._lock:
            dummy = self._dummies.get(cost)
            if dummy is None:
                dummy = self._dummies[cost] = b"$2b$%02d$" % cost + _FAKE_HASH[7:]
        return dummy


def load(path: str | None) -> WebConfig:
    """The web config in ``path`` (None or "": plain HTTP, no auth); WebConfigError if unusable."""
    if not path:
        return WebConfig()
    where = f"web config file {path}"
    raw = _read_bounded(path, where, MAX_WEB_CONFIG_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"{where} is not UTF-8 text (byte {exc.start + 1} is not)") from None
    data, lines = _read_yaml(text, where)
    try:
        return _parse({} if data is None else data, Path(path).parent, path, lines)
    except WebConfigError as exc:
        raise WebConfigError(f"{where}: {exc}") from None


def _read_bounded(path: str, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; WebConfigError otherwise."""
    try:
        return read_regular_file(path, limit)
    except NotRegularFile:
        raise WebConfigError(f"cannot read {what}: not a regular file") from None
    except FileTooLarge:
        raise WebConfigError(f"cannot read {what}: larger than {limit // 1024} KiB") from None
    except OSError as exc:
        raise WebConfigError(f"cannot read {what}: {exc.strerror or type(exc).__name__}") from None


# A quoted part of a YAML error ('\t', an alias or a tag name): the file's text, never shown.
_QUOTED = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""")


def _read_yaml(text: str, where: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """The file's data and the line of each key (up to three levels deep); errors say where, not what."""
    loader = NoAliasLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except AliasRefused as exc:
        raise WebConfigError(f"{where}: YAML aliases are not allowed (line {exc.mark.line + 1})") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = _QUOTED.sub("…", exc.problem or exc.context or "syntax error")
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise WebConfigError(f"{where} is not valid YAML: {problem}{at}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{where} is not valid YAML ({type(exc).__name__})") from None
    except RecursionError:
        raise WebConfigError(f"{where} is not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    lines: dict[tuple[str, ...], int] = {}
    pending: list[tuple[Any, tuple[str, ...]]] = [(node, ())] if node is not None else []
    while pending:
        item, prefix = pending.pop()
        if isinstance(item, yaml.MappingNode) and len(prefix) < 3:
            for key, value in item.value:
                if isinstance(key, yaml.ScalarNode):
                    lines.setdefault((*prefix, str(key.value)), key.start_mark.line + 1)
                    pending.append((value, (*prefix, str(key.value))))
    return data, lines


class _Lines:
    """`` (line N)`` of a key of the file, so an error can point at a value without quoting it."""

    def __init__(self, lines: dict[tuple[str, ...], int] | None):
        self.lines = lines or {}

    def __call__(self, *keys: Any) -> str:
        line = self.lines.get(tuple(str(key) for key in keys))
        return f" (line {line})" if line else ""


_NO_LINES = _Lines(None)


def _parse(data: Any, base: Path, path: str, lines: dict[tuple[str, ...], int] | None = None) -> WebConfig:
    at = _Lines(lines)
    top = _mapping(data, "the file", _TOP_KEYS, at=at)
    tls = _mapping(top.get("tls_server_config"), "tls_server_config", _TLS_KEYS, _UNSUPPORTED_TLS_KEYS, at=at)
    http = _mapping(top.get("http_server_config"), "http_server_config", _HTTP_KEYS, at=at)
    headers = _headers(_mapping(http.get("headers"), "http_server_config.headers", None, at=at), at)
    for section, name, flag in ((http, "http_server_config", "http2"),
                                (tls, "tls_server_config", "prefer_server_cipher_suites")):  # accepted, no effect
        if not isinstance(section.get(flag, True), bool):
            raise WebConfigError(f"{name}.{flag} must be true or false{at(name, flag)}")
    users = {}
    for user, hashed in _mapping(top.get("basic_auth_users"), "basic_auth_users", None, at=at).items():
        if not isinstance(user, (str, int)) or isinstance(user, bool):
            raise WebConfigError(f"basic_auth_users: a user name must be text{at('basic_auth_users', user)}")
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            raise WebConfigError(f"basic_auth_users: a password is not a bcrypt hash{at('basic_auth_users', user)} "
                                 "(make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        users[str(user)] = hashed.encode()
    stated = {section for section in OFF_ON_PURPOSE if top.get(section) == {}}
    if tls.get("client_auth_type") is not None:
        stated.add("client_auth_type")
    return WebConfig(tls_context=_tls_context(tls, base, at) if tls else None, users=users, headers=headers,
                     path=path, stated=frozenset(stated))


def _mapping(value: Any, where: str, allowed: set | None, unsupported: set | frozenset = frozenset(),
             at: _Lines = _NO_LINES) -> dict:
    keys = tuple(where.split(".")) if where != "the file" else ()
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping, not {type(value).__name__}{at(*keys)}")
    for key in value:
        if key in unsupported:
            raise WebConfigError(f"{where}.{key} is not supported by this exporter{at(*keys, key)}")
        if allowed is not None and key not in allowed:
            known = ", ".join(sorted(allowed))
            raise WebConfigError(f"unknown setting {_key(key)}in {where}{at(*keys, key)}; known: {known}")
    return value


_KEY_LIKE = re.compile(r"[A-Za-z][A-Za-z_-]{0,31}")


def _key(key: Any) -> str:
    """An unknown key, quoted when it looks like a setting's name (``tls_config``: letters, ``_`` and
    ``-``, short); anything else (a token, a line of a secret read as a key) is left to its line."""
    return f"{key!r} " if isinstance(key, str) and _KEY_LIKE.fullmatch(key) else ""


def _headers(headers: dict, at: _Lines = _NO_LINES) -> dict[str, str]:
    checked = {}
    for name, value in headers.items():
        where = at("http_server_config", "headers", name)
        if name not in ALLOWED_HEADERS:
            raise WebConfigError(f"HTTP header {_key(name)}can not be configured{where}; "
                                 f"one of {', '.join(ALLOWED_HEADERS)}")
        if value is not None and not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise WebConfigError(f"the value of {name} must be text{where}")
        value = "" if value is None else str(value)
        allowed = ALLOWED_HEADERS[name]
        if allowed and value not in allowed:
            raise WebConfigError(f"invalid value for {name}{where}; one of {', '.join(allowed)}")
        if "\r" in value or "\n" in value:
            raise WebConfigError(f"header {name} has a line break{where}")
        if value:  # blank means unset, as in exporter-toolkit
            checked[name] = value
    return checked


def _tls_context(tls: dict, base: Path, at: _Lines = _NO_LINES) -> ssl.SSLContext:
    def file(key: str) -> str | None:
        value = tls.get(key)
        if value in (None, ""):
            return None
        if not isinstance(value, str):
            raise WebConfigError(f"tls_server_config.{key} must be a file name{at('tls_server_config', key)}")
        return str(base / value)

    cert, key, client_ca = file("cert_file"), file("key_file"), file("client_ca_file")
    if cert is None:
        raise WebConfigError("tls_server_config needs cert_file")
    if key is None:
        raise WebConfigError("tls_server_config needs key_file")
    auth = tls.get("client_auth_type") or "NoClientCert"
    if not isinstance(auth, str) or auth not in CLIENT_AUTH:
        raise WebConfigError(f"invalid client_auth_type{at('tls_server_config', 'client_auth_type')}; "
                             f"one of {', '.join(CLIENT_AUTH)}")
    verify_mode, needs_ca = CLIENT_AUTH[auth]
    if client_ca and auth == "NoClientCert":
        raise WebConfigError("client_ca_file is set but client_auth_type is NoClientCert")
    if needs_ca and not client_ca:
        raise WebConfigError(f"client_auth_type {auth} needs client_ca_file")
    for name, value in (("cert_file", cert), ("key_file", key), ("client_ca_file", client_ca)):
        if value is not None:  # ssl reads them by name: a FIFO or /dev/zero must not reach it
            _read_bounded(value, f"{name} {value}", MAX_PEM_BYTES)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(tls, "min_version", "TLS12", at)
    context.maximum_version = _version(tls, "max_version", "TLS13", at)
    if context.minimum_version > context.maximum_version:
        raise WebConfigError("min_version is above max_version")
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"cannot load cert_file {cert} with key_file {key}: {_ssl_reason(exc)}") from None
    context.verify_mode = verify_mode
    if client_ca and verify_mode != ssl.CERT_NONE:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"cannot load client_ca_file {client_ca}: {_ssl_reason(exc)}") from None
    return context


def _no_password() -> str:
    """An encrypted key_file is an error, never a prompt on the terminal (which would hang a reload)."""
    raise WebConfigError("key_file is encrypted; give it unencrypted (exporter-toolkit reads no passphrase)")


def _version(tls: dict, key: str, default: str, at: _Lines = _NO_LINES) -> ssl.TLSVersion:
    name = tls.get(key) or default
    if not isinstance(name, str) or name not in TLS_VERSIONS:
        raise WebConfigError(f"invalid {key}{at('tls_server_config', key)}; one of {', '.join(TLS_VERSIONS)}")
    return TLS_VERSIONS[name]


def _ssl_reason(exc: Exception) -> str:
    """ssl's reason code (PEM_LIB, KEY_VALUES_MISMATCH) or the OS error: never the file's text."""
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
