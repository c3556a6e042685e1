# TLS for every door: server and client ssl contexts from PEM files, gRPC server credentials,
# and the identity a client certificate carries. Rules: TLS 1.2 at least; with client
# authentication on, a client without a certificate signed by the configured CA fails the
# handshake; the identity of a certificate is its subject's common name (CN).
from __future__ import annotations

import ssl
from typing import Any


def server_context(cert: str, key: str, ca: str | None = None,
                   client_auth: bool = False) -> ssl.SSLContext:
    """A server-side context: our ``cert`` chain and ``key`` (PEM paths). With ``ca``, client
    certificates signed by it are verified when sent (``client_auth``: required).
    Raises ``OSError``/``ssl.SSLError`` for unreadable or mismatched files, ``ValueError``
    for ``client_auth`` without ``ca``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_auth and not ca:
        raise ValueError("TLS client authentication needs a CA file to verify clients with")
    if ca:
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED if client_auth else ssl.CERT_OPTIONAL
    return context


def client_context(ca: str | None = None, cert: str | None = None,
                   key: str | None = None) -> ssl.SSLContext:
    """A client-side context that verifies the server against ``ca`` (default: the system's
    trust store) and presents ``cert``/``key`` when given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert:
        context.load_cert_chain(cert, key)
    return context


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def grpc_server_credentials(cert: str, key: str, ca: str | None = None,
                            client_auth: bool = False):
    """``grpc.ssl_server_credentials`` for the gRPC door (same meaning as server_context)."""
    import grpc
    if client_auth and not ca:
        raise ValueError("TLS client authentication needs a CA file to verify clients with")
    return grpc.ssl_server_credentials([(_read(key), _read(cert))],
                                       root_certificates=_read(ca) if ca else None,
                                       require_client_auth=client_auth)


def common_name(peercert: dict[str, Any] | None) -> str | None:
    """The subject CN of a verified peer certificate as ``SSLSocket.getpeercert()`` gives it
    (a tuple of RDNs, each a tuple of (name, value)); None without a certificate or CN."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return value
    return None
