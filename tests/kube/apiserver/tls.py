"""A self-signed certificate for the stand-in: kubectl sends bearer tokens only over TLS."""

from __future__ import annotations

import base64
import ssl
import subprocess
from pathlib import Path


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) for 127.0.0.1 and localhost, valid a day, its own CA (openssl CLI)."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "apiserver.crt", folder / "apiserver.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=standin-apiserver", "-keyout", str(key), "-out",
                    str(cert),
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,digitalSignature,keyCertSign"],
                   check=True, capture_output=True)
    return cert, key


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def ca_data(cert: Path) -> str:
    return base64.b64encode(cert.read_bytes()).decode()
