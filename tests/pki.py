"""A CA and a server certificate signed by it, made with ``openssl`` for one run: what the
chart's TLS Secret holds (``ca.crt``, ``tls.crt``, ``tls.key``), for a name of the caller's."""

from __future__ import annotations

import subprocess
from pathlib import Path


def issue(folder: Path, name: str) -> Path:
    """``folder``/ca.crt, and tls.crt/tls.key for DNS name ``name`` signed by that CA."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.crt"),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", str(folder / "tls.key"), "-out", str(folder / "tls.csr"),
    )  # fmt: skip
    (folder / "ext").write_text(f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\n")
    openssl(
        "x509", "-req", "-in", str(folder / "tls.csr"), "-CA", str(folder / "ca.crt"),
        "-CAkey", str(folder / "ca.key"), "-CAcreateserial", "-days", "1",
        "-extfile", str(folder / "ext"), "-out", str(folder / "tls.crt"),
    )  # fmt: skip
    return folder
