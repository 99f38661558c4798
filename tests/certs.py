"""A self-signed certificate for the tests' TLS servers on 127.0.0.1, made with the openssl
command (the test is skipped where there is none)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(folder: Path, subject: str, alt_name: str) -> tuple[Path, Path]:
    """(certificate, key) for ``subject`` (``/CN=...``) and ``alt_name`` (``DNS:...`` or
    ``IP:...``), valid two days, in ``folder``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", subject, "-addext",
                    f"subjectAltName={alt_name}"], check=True, capture_output=True,
                   timeout=60)
    return cert, key
