# TLS for every door: server and client ssl contexts from PEM files, gRPC server and channel
# credentials, what riverlog's own clients need to reach a TLS door (ClientTLS), and the
# identity a client certificate carries. Rules: TLS 1.2 at least; clients always verify the
# server's certificate and name; with client authentication on, a client without a
# certificate signed by the configured CA fails the handshake; the identity of a
# certificate is its subject's common name (CN).
from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class ClientTLS:
    """How riverlog's own clients (CLI, Spark source and sink) speak TLS to a door: ``ca``
    verifies the server (PEM path; None: the system's trust store), ``cert``/``key`` are
    the client certificate (PEM paths, both or neither), ``server_name`` is the name the
    server certificate must carry and the SNI sent (None: the host connected to).
    Picklable (paths only): Spark executors build their own context."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("a TLS client certificate needs both its certificate and its "
                             "key file")

    def context(self) -> ssl.SSLContext:
        """The client context (``client_context``). Raises ``OSError`` naming the files
        when one is unreadable or bad."""
        try:
            return client_context(self.ca, self.cert, self.key)
        except OSError as exc:  # ssl.SSLError included; neither names the file
            files = ", ".join(f"{k} {v}" for k, v in (("CA", self.ca), ("certificate",
                              self.cert), ("key", self.key)) if v)
            raise OSError(f"cannot load {files}: {exc.strerror or exc}") from None

    def grpc_credentials(self):
        """``grpc.ssl_channel_credentials`` from the same files; ``server_name`` goes in the
        channel options (``grpc_options``). Raises ``OSError`` for unreadable files."""
        import grpc
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca) if self.ca else None,
            private_key=_read(self.key) if self.key else None,
            certificate_chain=_read(self.cert) if self.cert else None)

    def grpc_options(self) -> list[tuple[str, str]]:
        """Channel options: the name to verify the server against, when set."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


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
