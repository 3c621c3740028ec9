"""A small blocking HTTP/1.1 GET client that reads a body straight into a caller's buffer.

Why not aiohttp here: at multi-GB/s the per-piece `bytes` objects and the event loop cost more CPU
than the transfer itself. A thread per connection with `readinto` puts the bytes from the kernel
directly where the engine will read them, and hashes each piece while it is still in cache;
`recv_into` and the digests release the GIL, so connections really run in parallel. Measured against
aiohttp and httpx on the same pulls (benchmarks/bench_chunk_client.py, BENCHMARKS.md section 1a):
the libraries reach 0.72-0.89 of its throughput at 40-50 % more CPU per byte, so it stays.

Only what weight transfer needs: GET, keep-alive, Content-Length or chunked bodies, http and https.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from rlboost.contracts import digest
from rlboost.contracts.env_names import Env
from rlboost.contracts.tls import check_pin, normalize_fingerprint, pinned_socket_context
from rlboost.weights.serving import RateLimit

PIECE = 1024 * 1024  # bytes per readinto: hashed while still in L2; fewer Python-level calls than 256 KiB
_MAX_HEADER = 64 * 1024


class SourceError(Exception):
    """The source failed this request (connection, timeout, bad status, short body)."""

    def __init__(self, message: str, *, retryable: bool = True, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable, self.status = retryable, status


@dataclass
class Partial:
    """A chunk body in progress: survives a broken connection so the next try asks for the rest."""

    got: int
    hasher: digest.Hasher
    sources: set[str]
    alg: digest.Algorithm = digest.DEFAULT

    @classmethod
    def new(cls, alg: digest.Algorithm = digest.DEFAULT) -> Partial:
        return cls(0, digest.hasher(alg), set(), alg)

    def reset(self) -> None:
        self.got, self.hasher = 0, digest.hasher(self.alg)


class HttpConn:
    def __init__(self, base_url: str, token: str | None, timeout_s: float, fingerprint: str | None = None) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base = base_url.split("#", 1)[0].rstrip("/")
        # https is pinned, never CA-checked: to the fingerprint given, else the one a peer advertises in
        # its URL (`#sha256=<hex>`), else the trainer's (RLBOOST_TLS_FINGERPRINT)
        frag = u.fragment[len("sha256=") :] if u.fragment.startswith("sha256=") else None
        self.fingerprint = fingerprint or frag or os.environ.get(Env.TLS_FINGERPRINT) or None
        self.host, self.tls = u.hostname, u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self.token, self.timeout_s = token, timeout_s
        self._sock: socket.socket | None = None
        self._rfile = None

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._rfile = None, None

    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            if not self.fingerprint:
                sock.close()
                raise SourceError(f"{self.base}: https without a pinned fingerprint", retryable=False)
            try:
                sock = pinned_socket_context().wrap_socket(sock, server_hostname=self.host)
                check_pin(sock, normalize_fingerprint(self.fingerprint))
            except (OSError, ValueError) as e:
                sock.close()
                raise SourceError(f"{self.base}: TLS: {e}", retryable=False) from e
        self._sock, self._rfile = sock, sock.makefile("rb", buffering=PIECE)

    def _send(self, path: str, headers: dict[str, str]) -> None:
        lines = [f"GET {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if self.token:
            lines.append(f"Authorization: Bearer {self.token}")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        assert self._sock is not None
        self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def _read_head(self) -> tuple[int, dict[str, str]]:
        assert self._rfile is not None
        status_line = self._rfile.readline(_MAX_HEADER)
        if not status_line:
            raise ConnectionResetError("connection closed before a response")
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise SourceError(f"malformed status line {status_line[:80]!r}")
        headers: dict[str, str] = {}
        total = len(status_line)
        while True:
            line = self._rfile.readline(_MAX_HEADER)
            total += len(line)
            if not line or total > _MAX_HEADER:
                raise SourceError("malformed or oversized response headers")
            if line in (b"\r\n", b"\n"):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(parts[1]), headers

    def request(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        """Send a GET and read the response head. A stale keep-alive connection is retried once."""
        for fresh in (self._sock is None, True):
            try:
                if self._sock is None:
                    self._connect()
                self._send(path, headers)
                return self._read_head()
            except (ConnectionResetError, BrokenPipeError) as e:
                self.close()
                if fresh:
                    raise SourceError(f"{self.base}: {e!r}") from e
            except (OSError, ssl.SSLError) as e:
                self.close()
                raise SourceError(f"{self.base}: {e!r}") from e
        raise AssertionError("unreachable")

    def read_text(self, headers: dict[str, str], limit: int = 4096) -> str:
        """Read (and drop) a small body: the detail of an error answer."""
        assert self._rfile is not None
        try:
            if headers.get("transfer-encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self._rfile.readline(1024).split(b";")[0], 16)
                    if size == 0:
                        self._rfile.readline(1024)
                        break
                    out += self._rfile.read(size + 2)[:size]
            elif "content-length" in headers:
                out = self._rfile.read(int(headers["content-length"]))
            else:
                out = self._rfile.read(limit)
                self.close()
        except (OSError, ValueError):
            self.close()
            return ""
        if headers.get("connection", "").lower() == "close":
            self.close()
        return out[:limit].decode("utf-8", "replace")

    def read_body_into(
        self, dest: memoryview, n: int, part: Partial, limit: RateLimit | None, stop: threading.Event | None
    ) -> int:
        """Read exactly n body bytes into dest[part.got:], hashing as they land. Returns bytes read."""
        assert self._rfile is not None
        end, start = part.got + n, part.got
        try:
            while part.got < end:
                k = min(PIECE, end - part.got)
                if limit is not None:
                    time.sleep(limit.reserve(k))
                if stop is not None and stop.is_set():
                    raise SourceError("pull cancelled", retryable=False)
                got = self._rfile.readinto(dest[part.got : part.got + k])
                if not got:
                    raise SourceError(f"{self.base}: body cut short at {part.got - start} of {n} bytes")
                part.hasher.update(dest[part.got : part.got + got])
                part.got += got
        except (OSError, ssl.SSLError) as e:
            self.close()
            raise SourceError(f"{self.base}: {e!r}") from e
        except SourceError:
            self.close()
            raise
        return part.got - start
