"""SASL logins in front of the test Kafka broker, for the suite's SASL tests.

    sasl_proxy.py PORT BROKER_PORT USER:PASSWORD [USER:PASSWORD …]

Tansu 0.6, the only Kafka broker installable here, keeps no SCRAM users (its memory and S3
engines discard them) and has no PLAIN. This proxy does what a broker's SASL listener does:
it answers ApiVersions through the broker, then SaslHandshake and SaslAuthenticate itself —
PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, the server side of SCRAM from `scramp` (PyPI, the
implementation pg8000 uses) — and once a client has logged in it passes every later byte to
the broker untouched. A wrong password ends the exchange with SASL_AUTHENTICATION_FAILED (58)
and the connection. The client side — librdkafka's SASL — is the real one. Loopback only.
"""

import asyncio
import struct
import sys

from scramp import ScramException, ScramMechanism

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
FAILED = 58  # SASL_AUTHENTICATION_FAILED
UNSUPPORTED_MECHANISM = 33


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_uvarint(buf: bytes, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, at


def skip_tags(buf: bytes, at: int) -> int:
    count, at = read_uvarint(buf, at)
    for _ in range(count):
        _, at = read_uvarint(buf, at)
        size, at = read_uvarint(buf, at)
        at += size
    return at


def header(frame: bytes) -> tuple[int, int, int, int]:
    """api_key, api_version, correlation_id and where the body starts."""
    api_key, version, correlation = struct.unpack(">hhi", frame[:8])
    (client_len,) = struct.unpack(">h", frame[8:10])
    at = 10 + max(client_len, 0)
    if api_key == SASL_AUTHENTICATE and version >= 2:
        at = skip_tags(frame, at)  # request header v2
    return api_key, version, correlation, at


def auth_bytes(frame: bytes, version: int, at: int) -> bytes:
    if version >= 2:
        size, at = read_uvarint(frame, at)
        return frame[at : at + size - 1]
    (size,) = struct.unpack(">i", frame[at : at + 4])
    return frame[at + 4 : at + 4 + size]


def authenticate_response(correlation, version, error, message, data) -> bytes:
    if version >= 2:
        msg = uvarint(0) if message is None else uvarint(len(message) + 1) + message.encode()
        body = (
            struct.pack(">i", correlation)
            + uvarint(0)  # response header v1: tagged fields
            + struct.pack(">h", error)
            + msg
            + uvarint(len(data) + 1)
            + data
            + struct.pack(">q", 0)
            + uvarint(0)
        )
        return body
    msg = struct.pack(">h", -1) if message is None else struct.pack(">h", len(message)) + message.encode()
    body = struct.pack(">ih", correlation, error) + msg + struct.pack(">i", len(data)) + data
    if version >= 1:
        body += struct.pack(">q", 0)
    return body


def handshake_response(correlation, error) -> bytes:
    body = struct.pack(">ihi", correlation, error, len(MECHANISMS))
    for m in MECHANISMS:
        body += struct.pack(">h", len(m)) + m.encode()
    return body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def send(writer: asyncio.StreamWriter, body: bytes) -> None:
    writer.write(struct.pack(">i", len(body)) + body)


class Login:
    """One connection's SASL exchange."""

    def __init__(self, users: dict[str, str]):
        self.users = users
        self.mechanism = None
        self.server = None
        self.done = False

    def step(self, data: bytes) -> tuple[int, str | None, bytes]:
        """The answer to one SaslAuthenticate: error code, message, bytes."""
        if self.mechanism == "PLAIN":
            parts = data.split(b"\0")
            if len(parts) == 3 and self.users.get(parts[1].decode()) == parts[2].decode():
                self.done = True
                return 0, None, b""
            return FAILED, "Authentication failed: invalid username or password", b""
        try:
            if self.server is None:
                mech = ScramMechanism(self.mechanism)
                infos = {u: mech.make_auth_info(p, iteration_count=4096) for u, p in self.users.items()}

                def auth_fn(user):
                    if user not in infos:
                        raise ScramException("unknown-user")
                    return infos[user]

                self.server = mech.make_server(auth_fn)
                self.server.set_client_first(data.decode())
                return 0, None, self.server.get_server_first().encode()
            self.server.set_client_final(data.decode())
            self.done = True
            return 0, None, self.server.get_server_final().encode()
        except ScramException as e:
            return FAILED, f"Authentication failed during authentication due to invalid credentials with SASL mechanism {self.mechanism} ({e})", b""


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def serve(reader, writer, broker_port: int, users: dict[str, str]) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", broker_port)
    except OSError:
        writer.close()
        return
    login = Login(users)
    try:
        while not login.done:
            frame = await read_frame(reader)
            api_key, version, correlation, at = header(frame)
            if api_key == SASL_HANDSHAKE:
                (n,) = struct.unpack(">h", frame[at : at + 2])
                login.mechanism = frame[at + 2 : at + 2 + n].decode()
                ok = login.mechanism in MECHANISMS
                send(writer, handshake_response(correlation, 0 if ok else UNSUPPORTED_MECHANISM))
            elif api_key == SASL_AUTHENTICATE and login.mechanism:
                error, message, data = login.step(auth_bytes(frame, version, at))
                send(writer, authenticate_response(correlation, version, error, message, data))
                if error:
                    await writer.drain()
                    writer.close()
                    up_writer.close()
                    return
            elif api_key == 18:  # ApiVersions: the broker's answer
                send(up_writer, frame)
                send(writer, await read_frame(up_reader))
            else:  # anything else before a login: refused, as a broker does
                writer.close()
                up_writer.close()
                return
            await writer.drain()
            await up_writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, struct.error, IndexError, UnicodeDecodeError):
        # A client gone, or bytes that are not Kafka requests: the connection ends.
        writer.close()
        up_writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def main() -> None:
    port, broker_port = int(sys.argv[1]), int(sys.argv[2])
    users = dict(u.split(":", 1) for u in sys.argv[3:])
    server = await asyncio.start_server(
        lambda r, w: serve(r, w, broker_port, users), "127.0.0.1", port
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
