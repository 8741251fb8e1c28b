"""--web.config.file: the exporter-toolkit format, checked at load; TLS, mutual TLS, basic auth and
headers on every endpoint of a real (in-process) server, with certificates made at test time."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl

import pytest
from prometheus_client import Gauge

from certs import PASSWORD, make_pki, password_hash, write_web_config
from verl_exporter.exposition import Exposition
from verl_exporter.http import server as server_module
from verl_exporter.http import web_config
from verl_exporter.http.web_config import WebConfigError

ENDPOINTS = {"/metrics": 200, "/-/healthy": 200, "/-/ready": 200, "/": 200, "/nothing-here": 404}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def hashed():
    return password_hash()


def tls_section(pki, **extra) -> dict:
    return {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **extra}


@pytest.fixture(scope="module")
def http_server():
    """One server for the module; each test gives it its web config, as a reload does."""
    gauge = Gauge("verl_test_value", "A test gauge.", registry=None)
    gauge.set(1)
    http, _ = server_module.serve(("127.0.0.1", 0), Exposition([gauge]))
    yield http
    http.shutdown()
    http.server_close()


@pytest.fixture
def serve_with(tmp_path, http_server):
    """Serve with the web config ``config`` (a dict); the server's port."""

    def start(config: dict):
        http_server.web = web_config.load(str(write_web_config(tmp_path / "web.yml", config)))
        return http_server.server_address[1]

    yield start
    http_server.web = web_config.WebConfig()


def client_context(pki, cert=None, key=None, **versions) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        context.load_cert_chain(str(cert), str(key))
    for name, value in versions.items():
        setattr(context, name, value)
    return context


def get(port: int, path: str = "/metrics", context: ssl.SSLContext | None = None, user: str | None = None,
        password: str = PASSWORD) -> tuple[int, dict, bytes]:
    connection = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10) if context
                  else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


# --- loading -------------------------------------------------------------------------------------


def test_no_file_is_plain_http_without_auth():
    web = web_config.load(None)
    assert web.tls_context is None and web.users == {} and web.headers == {}
    assert web_config.load("").check_password("anyone", "anything")


def test_a_full_file_loads_with_paths_relative_to_it(tmp_path, pki, hashed):
    (tmp_path / "tls").mkdir()
    for source, name in ((pki.server_cert, "server.crt"), (pki.server_key, "server.key"), (pki.ca, "ca.crt")):
        (tmp_path / "tls" / name).write_bytes(source.read_bytes())
    path = write_web_config(tmp_path / "web.yml", {
        "tls_server_config": {"cert_file": "tls/server.crt", "key_file": "tls/server.key",
                              "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "tls/ca.crt",
                              "min_version": "TLS13", "max_version": "TLS13"},
        "http_server_config": {"http2": True, "headers": {"X-Frame-Options": "deny", "X-XSS-Protection": "",
                                                          "Strict-Transport-Security": "max-age=31536000"}},
        "basic_auth_users": {"alice": hashed},
    })
    web = web_config.load(str(path))
    assert web.tls_context.verify_mode == ssl.CERT_REQUIRED
    assert web.tls_context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert web.headers == {"X-Frame-Options": "deny", "Strict-Transport-Security": "max-age=31536000"}
    assert set(web.users) == {"alice"}


BAD_FILES = {
    # name: (file content as a dict or raw text, a word the one-line message must contain)
    "unknown top-level key": ({"basic_auth": {}}, "basic_auth"),
    "unknown TLS key": ({"tls_server_config": {"cert_file": "a", "key_file": "b", "ca_file": "c"}}, "ca_file"),
    "inline certificate": ({"tls_server_config": {"cert": "PEM"}}, "not supported"),
    "rate limit": ({"rate_limit": {"interval": "1s"}}, "rate_limit"),
    "header that cannot be set": ({"http_server_config": {"headers": {"Server": "x"}}}, "Server"),
    "bad X-Frame-Options": ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "X-Frame-Options"),
    "bad X-Content-Type-Options": ({"http_server_config": {"headers": {"X-Content-Type-Options": "sniff"}}}, "nosniff"),
    "http2 not a boolean": ({"http_server_config": {"http2": "yes"}}, "http2"),
    "password not hashed": ({"basic_auth_users": {"alice": "plain-text"}}, "bcrypt"),
    "users not a mapping": ({"basic_auth_users": ["alice"]}, "mapping"),
    "cert without key": ({"tls_server_config": {"cert_file": "server.crt"}}, "key_file"),
    "key without cert": ({"tls_server_config": {"key_file": "server.key"}}, "cert_file"),
    "missing cert file": ({"tls_server_config": {"cert_file": "nope.crt", "key_file": "nope.key"}}, "nope"),
    "bad client_auth_type": ("tls", {"client_auth_type": "Sometimes"}, "client_auth_type"),
    "client CA without client auth": ("tls", {"client_ca_file": "CA"}, "NoClientCert"),
    "verification without a CA": ("tls", {"client_auth_type": "RequireAndVerifyClientCert"}, "client_ca_file"),
    "bad min_version": ("tls", {"min_version": "SSL3"}, "min_version"),
    "min above max": ("tls", {"min_version": "TLS13", "max_version": "TLS12"}, "max_version"),
    "not a mapping": ("- a\n- b\n", "mapping"),
    "not YAML": ("tls_server_config: [\n", "YAML"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_a_one_line_error(tmp_path, pki, case):
    content, *rest = BAD_FILES[case]
    if content == "tls":  # a valid cert and key, plus the broken setting
        content = {"tls_server_config": tls_section(pki, **rest[0])}
        if "CA" in content["tls_server_config"].values():
            content["tls_server_config"]["client_ca_file"] = str(pki.ca)
    word = rest[-1]
    path = tmp_path / "web.yml"
    path.write_text(content) if isinstance(content, str) else write_web_config(path, content)
    with pytest.raises(WebConfigError) as raised:
        web_config.load(str(path))
    message = str(raised.value)
    assert "\n" not in message and word in message and str(path) in message, message


def test_an_unreadable_file_is_an_error(tmp_path):
    with pytest.raises(WebConfigError, match="cannot read"):
        web_config.load(str(tmp_path / "missing.yml"))


def test_a_key_that_does_not_match_the_certificate_is_an_error(tmp_path, pki):
    path = write_web_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_cert), "key_file": str(pki.client_key)}})
    with pytest.raises(WebConfigError, match="cannot load cert_file"):
        web_config.load(str(path))


# --- passwords -----------------------------------------------------------------------------------


def test_passwords_are_checked_with_bcrypt_once_and_then_cached(monkeypatch, hashed):
    calls = []
    real = web_config.bcrypt.checkpw
    monkeypatch.setattr(web_config.bcrypt, "checkpw", lambda *args: calls.append(1) or real(*args))
    web = web_config.WebConfig(users={"alice": hashed.encode()})
    assert all(web.check_password("alice", PASSWORD) for _ in range(20))
    assert len(calls) == 1
    assert not any(web.check_password("alice", "wrong") for _ in range(5))
    assert not web.check_password("mallory", PASSWORD)  # unknown users cost a bcrypt too
    assert not web.check_password("alice", "")
    assert len(calls) == 4


def test_the_cache_keeps_user_and_password_apart(hashed):
    web = web_config.WebConfig(users={"alice": password_hash("x\0y").encode()})
    assert web.check_password("alice", "x\0y")
    assert not web.check_password("alice\0x", "y") and not web.check_password("alicex", "\0y")


def test_passwords_longer_than_bcrypt_takes_are_refused(hashed):
    web = web_config.WebConfig(users={"alice": hashed.encode()})
    assert not web.check_password("alice", PASSWORD + "x" * 100)


def test_a_new_config_does_not_inherit_the_old_cache(hashed):
    old = web_config.WebConfig(users={"alice": hashed.encode()})
    assert old.check_password("alice", PASSWORD)
    new = web_config.WebConfig(users={"alice": password_hash("another").encode()})
    assert not new.check_password("alice", PASSWORD) and new.check_password("alice", "another")


# --- serving -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
def test_basic_auth_on_every_endpoint(serve_with, hashed, path):
    port = serve_with({"basic_auth_users": {"alice": hashed}})
    assert get(port, path, user="alice")[0] == ENDPOINTS[path]
    for user, password in (("alice", "wrong"), ("bob", PASSWORD), ("alice", PASSWORD.upper())):
        status, headers, body = get(port, path, user=user, password=password)
        assert (status, headers.get("WWW-Authenticate")) == (401, "Basic"), (user, password)
        assert b"verl_test_value" not in body
    status, headers, _ = get(port, path)
    assert (status, headers.get("WWW-Authenticate")) == (401, "Basic")


@pytest.mark.parametrize("authorization", ["Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"alice").decode(),
                                           "Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "Basic"])
def test_malformed_credentials_are_refused(serve_with, hashed, authorization):
    port = serve_with({"basic_auth_users": {"alice": hashed}})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/metrics", headers={"Authorization": authorization})
    assert connection.getresponse().status == 401
    connection.close()


def test_headers_on_every_answer(serve_with, hashed):
    port = serve_with({"http_server_config": {"headers": {"X-Content-Type-Options": "nosniff",
                                                          "Content-Security-Policy": "default-src 'self'"}},
                       "basic_auth_users": {"alice": hashed}})
    for path, code in ENDPOINTS.items():
        for user in ("alice", None):
            status, headers, _ = get(port, path, user=user)
            assert status == (code if user else 401)
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert headers["Content-Security-Policy"] == "default-src 'self'"


def test_tls(serve_with, pki):
    port = serve_with({"tls_server_config": tls_section(pki)})
    for path, code in ENDPOINTS.items():
        assert get(port, path, client_context(pki))[0] == code
    with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust the CA
        get(port, "/metrics", ssl.create_default_context())


def test_plain_http_to_the_tls_port_gets_a_clear_400(serve_with, pki):
    port = serve_with({"tls_server_config": tls_section(pki)})
    status, _, body = get(port, "/metrics")
    assert status == 400 and body == b"Client sent an HTTP request to an HTTPS server.\n"
    assert get(port, "/metrics", client_context(pki))[0] == 200  # and keeps serving TLS


def test_a_stalled_tls_client_does_not_block_others(serve_with, pki):
    port = serve_with({"tls_server_config": tls_section(pki)})
    with socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port)) as half:
        half.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
        assert get(port, "/-/healthy", client_context(pki))[0] == 200


def test_tls_versions(serve_with, pki):
    port = serve_with({"tls_server_config": tls_section(pki, min_version="TLS13")})
    assert get(port, "/metrics", client_context(pki))[0] == 200
    with pytest.raises(ssl.SSLError):
        get(port, "/metrics", client_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2))


def refused(port, context) -> bool:
    """The server ends the connection without an answer (TLS 1.3 reports a refused client
    certificate on the first read, not in the handshake)."""
    try:
        get(port, "/metrics", context)
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
        return True
    return False


def test_mutual_tls(serve_with, pki):
    port = serve_with({"tls_server_config": tls_section(pki, client_auth_type="RequireAndVerifyClientCert",
                                                        client_ca_file=str(pki.ca))})
    assert get(port, "/metrics", client_context(pki, pki.client_cert, pki.client_key))[0] == 200
    assert refused(port, client_context(pki))  # no client certificate
    assert refused(port, client_context(pki, pki.stranger_cert, pki.stranger_key))  # from another CA
    assert get(port, "/metrics", client_context(pki, pki.client_cert, pki.client_key))[0] == 200


def test_client_certificate_if_given(serve_with, pki):
    port = serve_with({"tls_server_config": tls_section(pki, client_auth_type="VerifyClientCertIfGiven",
                                                        client_ca_file=str(pki.ca))})
    assert get(port, "/metrics", client_context(pki))[0] == 200
    assert get(port, "/metrics", client_context(pki, pki.client_cert, pki.client_key))[0] == 200
    assert refused(port, client_context(pki, pki.stranger_cert, pki.stranger_key))


def test_mutual_tls_and_basic_auth_together(serve_with, pki, hashed):
    port = serve_with({"tls_server_config": tls_section(pki, client_auth_type="RequireAnyClientCert",
                                                        client_ca_file=str(pki.ca)),
                       "basic_auth_users": {"alice": hashed}})
    context = client_context(pki, pki.client_cert, pki.client_key)
    assert get(port, "/metrics", context, user="alice")[0] == 200
    assert get(port, "/metrics", context, user="alice", password="wrong")[0] == 401
    assert refused(port, client_context(pki))
