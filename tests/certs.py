"""Certificates made at test time with the openssl command: a CA, a server and a client it signed,
and a client signed by another CA; plus a fast bcrypt hash and a web config file writer."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import yaml

from servers import require_binary

PASSWORD = "s3cret pass:word"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate from another CA
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([require_binary("openssl"), *args], cwd=cwd, check=True, capture_output=True)


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)


def _leaf(directory: Path, name: str, ca: str, usage: str) -> None:
    (directory / f"{name}.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage={usage}\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    _leaf(directory, "server", "ca", "serverAuth")
    _leaf(directory, "client", "ca", "clientAuth")
    _leaf(directory, "stranger", "other-ca", "clientAuth")
    d = directory
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
               d / "stranger.crt", d / "stranger.key")


def password_hash(password: str = PASSWORD) -> str:
    """A bcrypt hash at the lowest cost, so tests stay fast."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def write_web_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path
