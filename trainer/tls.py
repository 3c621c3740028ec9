"""TLS for the trainer's port: a per-job self-signed certificate, pinned by fingerprint.

The controller makes the certificate before the trainer starts, so it knows the fingerprint up
front and hands it to every worker at boot: no CA, no trust-on-first-use. Loopback-only jobs skip
TLS by default (nothing leaves the machine); any other bind address gets it.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    fingerprint: str  # sha256 of the DER certificate, hex


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_self_signed(directory: Path, hosts: list[str], days: int = 30) -> TlsFiles:
    """Create (or reuse) a key and certificate for `hosts` in `directory` (key mode 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_path, key_path = directory / "trainer-cert.pem", directory / "trainer-key.pem"
    if cert_path.exists() and key_path.exists():
        return TlsFiles(cert_path, key_path, fingerprint_of(cert_path))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rlboost-trainer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return TlsFiles(cert_path, key_path, fingerprint_of(cert_path))


def fingerprint_of(cert_path: Path) -> str:
    der = ssl.PEM_cert_to_DER_cert(cert_path.read_text())
    return hashlib.sha256(der).hexdigest()


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def pinned(fingerprint: str | None) -> aiohttp.Fingerprint | bool:
    """aiohttp `ssl=` value: pin the trainer's certificate, or plain default for http URLs."""
    if not fingerprint:
        return True
    return aiohttp.Fingerprint(bytes.fromhex(fingerprint))


def client_context(cert: Path) -> ssl.SSLContext:
    """For the controller (httpx): trust exactly this certificate, nothing else."""
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False  # the address may be an IP a cloud assigned; the pin is the check
    return ctx
