"""How a client checks the certificate of a server it was told to trust by a command line:
a file of CA certificates (``--peer-ca-file``, the operator's ``--agent-ca-file``, the pod's
cluster CA) and the name the certificate must hold (``--peer-server-name``,
``--agent-server-name``) when the server is reached at an address no certificate names."""

from __future__ import annotations

import re
import ssl

from node_agent.errors import ConfigError

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def ca_context(path: str, what: str) -> ssl.SSLContext:
    """A client context that trusts the CA certificates in ``path`` (and checks names);
    ConfigError naming ``what`` (the flag) when the file cannot be used."""
    if not path:
        # ssl would take an empty path for "none given" and trust the system's CAs instead.
        raise ConfigError(f"{what}: give a PEM file of CA certificates (the path is empty)")
    try:
        return ssl.create_default_context(cafile=path)
    except FileNotFoundError as exc:
        raise ConfigError(f"{what}: {path} does not exist") from exc
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{what} {path}: no CA certificates read ({exc}): it must be a PEM file of "
            "certificates (e.g. the ca.crt of the agents' TLS Secret)"
        ) from exc


def server_name(raw: str) -> str:
    """A DNS name as a certificate holds it (lower case, no final dot); ValueError else."""
    name = raw.strip().lower().rstrip(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(DNS_LABEL.fullmatch(label) for label in labels):
        raise ValueError("a DNS name, e.g. corral-agent.corral.svc")
    return name
