"""Reading --web.config.file is bounded: a FIFO, /dev/zero, a directory or a file over 256 KiB is
refused at once (also as a certificate, key or CA file), YAML aliases and deep nesting are refused,
an encrypted key is an error rather than a passphrase prompt, and no error quotes the file's text:
a web config that points at a secret must not copy it into the log."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
import yaml

from certs import make_pki, write_web_config
from verl_exporter.http import web_config
from verl_exporter.http.web_config import WebConfigError

MAX_WEB_CONFIG_BYTES = 256 * 1024
SECRET = "s3cr3t-T0KEN-9f8e7d6c5b4a"


def load_within(path, seconds: float = 5.0) -> str:
    """``web_config.load(path)``'s error message; fails (rather than hangs) if it takes longer."""
    outcome: dict = {}

    def run():
        started = time.monotonic()
        try:
            web_config.load(str(path))
            outcome["error"] = None
        except WebConfigError as exc:
            outcome["error"] = str(exc)
        except BaseException as exc:  # noqa: BLE001 (reported by the assertion below)
            outcome["error"] = f"unexpected {type(exc).__name__}: {exc}"
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"loading {path} still blocks after {seconds}s"
    assert outcome["error"] is not None, f"{path} loaded"
    assert "\n" not in outcome["error"] and not outcome["error"].startswith("unexpected"), outcome["error"]
    return outcome["error"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo.yml"
    os.mkfifo(path)
    return path


def test_dev_zero_a_fifo_and_a_directory_are_refused_at_once(tmp_path, fifo):
    for path in ("/dev/zero", fifo, tmp_path):
        assert "not a regular file" in load_within(path)


def test_a_fifo_with_a_writer_is_refused_too(fifo):
    def write():
        try:
            with open(fifo, "w") as out:
                out.write("basic_auth_users: {}\n" * 100)
        except OSError:  # the reader went away (EPIPE): expected
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert "not a regular file" in load_within(fifo)
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let a writer still waiting to open go
    writer.join(5)


def test_a_file_over_the_cap_is_refused(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: {}\n" + "#" * MAX_WEB_CONFIG_BYTES)
    assert "larger than 256 KiB" in load_within(path)
    path.write_text("basic_auth_users: {}\n" + "#" * (MAX_WEB_CONFIG_BYTES - 100) + "\n")
    assert web_config.load(str(path)).users == {}


@pytest.mark.parametrize("name", ["cert_file", "key_file", "client_ca_file"])
@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_certificate_key_or_ca_file_that_is_not_a_regular_file_is_refused(tmp_path, pki, fifo, name, special):
    section = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
               "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    section[name] = str(fifo) if special == "fifo" else special
    path = write_web_config(tmp_path / "web.yml", {"tls_server_config": section})
    message = load_within(path)
    assert name in message and "not a regular file" in message, message


def test_an_encrypted_key_is_an_error_not_a_passphrase_prompt(tmp_path, pki):
    key = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(pki.server_key), "-aes256", "-passout", "pass:x", "-out", str(key)],
                   check=True, capture_output=True)
    path = write_web_config(tmp_path / "web.yml", {"tls_server_config": {"cert_file": str(pki.server_cert),
                                                                         "key_file": str(key)}})
    assert "encrypted" in load_within(path)


BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))


@pytest.mark.parametrize("text, reason", [
    (BILLION_LAUGHS, "aliases"),
    ("basic_auth_users: &u {}\ntls_server_config: *u\n", "aliases"),
    ("x: &x {y: *x}\n", "aliases"),
    ("basic_auth_users: " + "[" * 50_000 + "]" * 50_000 + "\n", "YAML"),
])
def test_aliases_and_deep_nesting_are_refused(tmp_path, text, reason):
    path = tmp_path / "web.yml"
    path.write_text(text)
    assert reason in load_within(path)


# A secret where the web config should be: each case is a mistake that reaches a different check.
SECRETS = {
    "a private key": f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n",
    "an env file": f"TOKEN={SECRET}\nOTHER: [x\n",
    "a broken line": f"basic_auth_users:\n  alice: {SECRET}\n   bob: [\n",
    "a tab": f"basic_auth_users:\n\t{SECRET}: x\n",
    "a quoted key": f'"{SECRET}\\q": 1\n',
    "an unknown key": f"{SECRET}{SECRET}: 1\n",
    "an unknown section key": f"tls_server_config: {{'{SECRET} x': 1}}\n",
    "a password": f"basic_auth_users: {{alice: {SECRET}}}\n",
    "a user name": f"basic_auth_users: {{[{SECRET}]: x}}\n",
    "a header": f"http_server_config: {{headers: {{'{SECRET}': x}}}}\n",
    "a header value": f"http_server_config: {{headers: {{X-Frame-Options: {SECRET}}}}}\n",
    "a header value list": f"http_server_config: {{headers: {{X-XSS-Protection: [{SECRET}]}}}}\n",
    "client_auth_type": f"tls_server_config: {{cert_file: a, key_file: b, client_auth_type: {SECRET}}}\n",
    "min_version": f"tls_server_config: {{cert_file: a, key_file: b, min_version: {SECRET}}}\n",
    "http2": f"http_server_config: {{http2: {SECRET}}}\n",
    "a python tag": f"!!python/object:{SECRET} {{}}\n",
    "not UTF-8": f"basic_auth_users: {{}}\n# {SECRET}\n".encode() + b"\xff\xfe",
}


@pytest.mark.parametrize("case", SECRETS)
def test_no_error_quotes_the_file(tmp_path, case):
    path = tmp_path / "web.yml"
    content = SECRETS[case]
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    message = load_within(path)
    assert SECRET[:8] not in message, message
    assert str(path) in message, message


def test_an_error_points_at_the_line(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"alice": "plain"}}, default_flow_style=False))
    assert "(line 2)" in load_within(path)
    path.write_text("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: sometimes\n")
    assert "client_auth_type (line 4)" in load_within(path)
