"""TLS endpoints for the test suite's servers, with the certificate scripts/services.sh makes.

    tls_serve.py https PORT ROOT CERT KEY          ROOT over HTTPS, with Range requests
    tls_serve.py proxy PORT TARGET_PORT CERT KEY   TLS in front of a plain TCP server

`proxy` ends TLS for the Kafka broker (Tansu 0.6 takes `--cert` but never serves TLS), as
a TLS-terminating proxy (stunnel, Envoy, an ingress) does in front of a broker: the client's
TLS handshake, certificate check and encryption are real; the broker behind it sees plain
Kafka. Loopback only. Standard library and rangehttpserver only.
"""

import asyncio
import functools
import ssl
import sys
from http.server import ThreadingHTTPServer


def context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


def https(port: int, root: str, cert: str, key: str) -> None:
    from RangeHTTPServer import RangeRequestHandler

    handler = functools.partial(RangeRequestHandler, directory=root)
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    # The handshake happens in the request's thread, so a client that never finishes one
    # does not hold up the others.
    server.socket = context(cert, key).wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )
    server.serve_forever()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def proxy(port: int, target: int, cert: str, key: str) -> None:
    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(one, "127.0.0.1", port, ssl=context(cert, key))
    async with server:
        await server.serve_forever()


def main() -> None:
    mode, port, arg, cert, key = sys.argv[1:6]
    if mode == "https":
        https(int(port), arg, cert, key)
    elif mode == "proxy":
        asyncio.run(proxy(int(port), int(arg), cert, key))
    else:
        sys.exit(f"unknown mode {mode!r}: https or proxy")


if __name__ == "__main__":
    main()
