"""TLS for the trainer's port: a self-signed certificate, pinned by fingerprint.

Either the controller makes the certificate before the trainer starts (SkyPilot, whose other trainer
nodes need the pin too: the key pair travels as a task secret), or a trainer that enrols
(rlboost/contracts/enrolment.py) makes its own at boot and proves it to the controller, which pins it from
then on. Either way the controller knows the fingerprint before any worker launches and hands it to
every worker at boot: no CA, no trust-on-first-use. Loopback-only jobs skip TLS by default (nothing
leaves the machine); any other bind address gets it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from rlboost.contracts.env_names import Env


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
    return der_fingerprint(ssl.PEM_cert_to_DER_cert(cert_path.read_text()))


def der_fingerprint(der: bytes) -> str:
    """What workers pin: sha256 of the DER certificate, hex."""
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


# ---- wiring: which env carries what ----------------------------------------------------------

# Env.TLS_CERT / TLS_KEY: paths on the trainer's machine; Env.TLS_CERT_PEM / TLS_KEY_PEM: the same as
# PEM text, for a trainer on another machine (cloud nodes), written 0600 under its run dir;
# Env.TLS_FINGERPRINT: what workers pin (sha256 of the DER certificate, hex)
SECRET_ENV = (Env.TLS_KEY_PEM,)  # never log, never put in a task file in clear


class TlsConfigError(Exception):
    pass


def tls_wanted(mode: str, bind_host: str) -> bool:
    """spec `trainer.tls`: on, off, or auto (on unless the trainer binds loopback)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return not is_loopback(bind_host)


def server_tls_on(mode: str, bind_host: str, env: dict[str, str] | None = None) -> bool:
    """The trainer's choice: as tls_wanted, and also on under `auto` when it was handed a certificate."""
    env = dict(os.environ) if env is None else env
    given = any(env.get(k) for k in (Env.TLS_CERT, Env.TLS_CERT_PEM))
    return tls_wanted(mode, bind_host) or (mode == "auto" and given)


def normalize_fingerprint(fp: str) -> str:
    """Accept `AB:CD:..` or plain hex; return lowercase hex of a sha256, or raise ValueError."""
    h = fp.strip().replace(":", "").lower()
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise ValueError("a TLS fingerprint is the sha256 of the certificate: 64 hex digits")
    return h


def server_files(run_dir: Path, hosts: list[str], env: dict[str, str] | None = None) -> TlsFiles:
    """The trainer's certificate: files named in env, PEM text in env (written 0600 into run_dir/tls),
    or else a fresh self-signed one in run_dir/tls (its fingerprint is written next to it)."""
    env = dict(os.environ) if env is None else env
    cert, key = env.get(Env.TLS_CERT), env.get(Env.TLS_KEY)
    if cert or key:
        if not (cert and key and Path(cert).is_file() and Path(key).is_file()):
            raise TlsConfigError(f"{Env.TLS_CERT} and {Env.TLS_KEY} must both name existing files")
        return TlsFiles(Path(cert), Path(key), fingerprint_of(Path(cert)))
    d = run_dir / "tls"
    cert_pem, key_pem = env.get(Env.TLS_CERT_PEM), env.get(Env.TLS_KEY_PEM)
    if cert_pem or key_pem:
        if not (cert_pem and key_pem):
            raise TlsConfigError(f"{Env.TLS_CERT_PEM} and {Env.TLS_KEY_PEM} must be given together")
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, text in (("trainer-cert.pem", cert_pem), ("trainer-key.pem", key_pem)):
            fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        return TlsFiles(d / "trainer-cert.pem", d / "trainer-key.pem", fingerprint_of(d / "trainer-cert.pem"))
    return make_self_signed(d, hosts)


def url_host(bind_host: str) -> str:
    """The host of the trainer's own URL: its bind address, or loopback for a wildcard bind."""
    return bind_host if bind_host not in ("0.0.0.0", "::") else "127.0.0.1"


def serving_files(mode: str, bind_host: str, run_dir: Path) -> TlsFiles | None:
    """The trainer's choice of certificate (spec `trainer.tls`), or None when it serves plain http."""
    if not server_tls_on(mode, bind_host):
        return None
    return server_files(run_dir, sorted({url_host(bind_host), "127.0.0.1", "localhost"}))


@dataclass(frozen=True)
class JobTls:
    """What the controller hands out: the trainer gets the key pair, workers only the fingerprint."""

    files: TlsFiles
    trainer_env: dict[str, str]
    worker_env: dict[str, str]

    def pinned_to(self, cert: Path) -> JobTls:
        """The job's TLS once its trainer made a certificate of its own (an enrolled trainer): the
        controller trusts `cert`, workers pin its fingerprint, the trainer is given nothing (the
        controller's own key in `files.key` never leaves it)."""
        fp = fingerprint_of(cert)
        return JobTls(TlsFiles(cert, self.files.key, fp), {}, {Env.TLS_FINGERPRINT: fp})


def job_tls(mode: str, run_dir: Path, bind_host: str, *, remote: bool | None = None) -> JobTls | None:
    """For the controller, before the trainer launches: None when TLS is off for this job, else a
    certificate in run_dir/tls and the env entries for the trainer's and the workers' LaunchRequests.

    `bind_host` is the address the trainer binds (127.0.0.1 for the local provider, 0.0.0.0 on
    clouds). `remote`: the trainer runs on another machine, so the key pair travels as PEM text
    (default: whenever the bind host is not loopback)."""
    if not tls_wanted(mode, bind_host):
        return None
    files = make_self_signed(run_dir / "tls", ["127.0.0.1", "localhost"])
    remote = (not is_loopback(bind_host)) if remote is None else remote
    if remote:
        trainer_env = {Env.TLS_CERT_PEM: files.cert.read_text(), Env.TLS_KEY_PEM: files.key.read_text()}
    else:
        trainer_env = {Env.TLS_CERT: str(files.cert), Env.TLS_KEY: str(files.key)}
    pin = files.fingerprint
    return JobTls(files, {**trainer_env, Env.TLS_FINGERPRINT: pin}, {Env.TLS_FINGERPRINT: pin})


def https_url(url: str) -> str:
    """A provider reports http://host:port for the trainer; with TLS on it is https."""
    return "https://" + url[len("http://") :] if url.startswith("http://") else url


def pinned_socket_context() -> ssl.SSLContext:
    """For blocking clients that check the pin themselves (rlboost/weights/chunk_http.py): no CA, no hostname."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the fingerprint comparison below is the verification
    return ctx


def check_pin(sock: ssl.SSLSocket, fingerprint: str) -> None:
    got = der_fingerprint(sock.getpeercert(binary_form=True) or b"")
    if not hmac.compare_digest(got, fingerprint):
        raise ssl.SSLError(f"certificate fingerprint {got[:16]}... does not match the pinned one")
