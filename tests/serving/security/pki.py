"""Certificates made at test time: a CA, a server certificate for 127.0.0.1/localhost, a client
certificate from the same CA, and a client certificate from a CA the server does not trust."""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(cert) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _cert(subject: str, issuer: str, public_key, signer, *, ca: bool = False, san=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _proto_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass
class Pki:
    dir: Path
    ca_pem: str
    server_key_pem: str
    server_cert_pem: str
    client_cert: tuple[str, str]  # (cert file, key file) for requests
    client_pems: tuple[bytes, bytes]  # (key, cert) for grpc
    stranger_cert: tuple[str, str]
    stranger_pems: tuple[bytes, bytes]

    @property
    def ca_file(self) -> str:
        return str(self.dir / "ca.pem")

    def ssl_config(self, client_verify: bool) -> Path:
        """A TF Serving SSLConfig text proto holding the PEM texts, as --ssl_config_file takes it."""
        path = self.dir / f"ssl-{int(client_verify)}.config"
        lines = [f"server_key: {_proto_string(self.server_key_pem)}",
                 f"server_cert: {_proto_string(self.server_cert_pem)}"]
        if client_verify:
            lines += [f"custom_ca: {_proto_string(self.ca_pem)}", "client_verify: true"]
        path.write_text("\n".join(lines) + "\n")
        return path


def make_pki(directory: Path) -> Pki:
    ca_key = _key()
    ca = _cert("modelyard-test-ca", "modelyard-test-ca", ca_key.public_key(), ca_key, ca=True)
    server_key = _key()
    server = _cert("localhost", "modelyard-test-ca", server_key.public_key(), ca_key,
                   san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    files = {}

    def client(name: str, issuer_key, issuer_name: str):
        key = _key()
        cert = _cert(name, issuer_name, key.public_key(), issuer_key)
        cert_file, key_file = directory / f"{name}.pem", directory / f"{name}.key"
        cert_file.write_text(_cert_pem(cert))
        key_file.write_text(_key_pem(key))
        files[name] = (str(cert_file), str(key_file))
        return _key_pem(key).encode(), _cert_pem(cert).encode()

    client_pems = client("client", ca_key, "modelyard-test-ca")
    other_ca_key = _key()
    stranger_pems = client("stranger", other_ca_key, "some-other-ca")
    (directory / "ca.pem").write_text(_cert_pem(ca))
    return Pki(directory, _cert_pem(ca), _key_pem(server_key), _cert_pem(server),
               files["client"], client_pems, files["stranger"], stranger_pems)
