"""The host's loopback services, relayed to the address session containers reach the host at, for
those containers alone (a connection from any other address is closed unread).

Two emulators of one user may relay the same port (SO_REUSEPORT): both lead to one service. The
internal network's relay binds with IP_FREEBIND: Podman puts that gateway address on the host
only while a container is on the bridge, and the listener must be there before."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

_CHUNK = 1 << 16
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)  # Linux's value; Python names it from 3.12


class LoopbackRelay:
    """TCP from `address:port` to `127.0.0.1:port`, for each port, for peers in `subnet`."""

    def __init__(
        self, address: str, subnet: str, ports: Iterable[int], *, freebind: bool = False
    ) -> None:
        """`freebind`: listen at `address` before the host has it (a bridge made later)."""
        self.address = address
        self.freebind = freebind
        self.ports = sorted(set(ports))
        self._peers = ipaddress.ip_network(subnet)
        self._servers: list[asyncio.Server] = []
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        try:
            for port in self.ports:
                serve = lambda r, w, port=port: self._relay(r, w, port)  # noqa: E731
                if self.freebind:
                    server = await asyncio.start_server(serve, sock=self._socket(port))
                else:
                    server = await asyncio.start_server(
                        serve,
                        self.address,
                        port,
                        reuse_port=True,  # another emulator of this user may relay it too
                    )
                self._servers.append(server)
        except OSError as e:
            await self.stop()
            raise RuntimeError(f"cannot relay loopback to {self.address}: {e}") from None

    def _socket(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.SOL_IP, _IP_FREEBIND, 1)
            sock.bind((self.address, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    async def _relay(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int
    ) -> None:
        peer = writer.get_extra_info("peername")
        if not peer or ipaddress.ip_address(peer[0]) not in self._peers:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        ends = (writer, up_writer)
        pipes = [
            asyncio.ensure_future(_pipe(reader, up_writer, ends)),
            asyncio.ensure_future(_pipe(up_reader, writer, ends)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes)
        finally:
            self._pipes.difference_update(pipes)
            for end in ends:
                end.close()


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    ends: tuple[asyncio.StreamWriter, ...],
) -> None:
    """Copy until EOF, then pass the EOF on (a half-close: the other way may still talk). A
    reset closes both connections, so the other way's read ends too."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        for end in ends:
            end.close()
