"""A Docker API version shim: a Unix socket in front of the engine's that
lowers the API version in request paths to the highest the engine speaks.

Why: testcontainers-rs 0.27 talks to Docker through bollard 0.20, which puts
API version 1.52 in every path (`/v1.52/containers/create`) and never
negotiates; an engine that speaks less (Debian 12's Docker 20.10 speaks
1.41) answers 400 "client version 1.52 is too new". Clients that ask for a
version the engine speaks (the docker CLI, docker-compose) pass unchanged.

Only request heads are read, to find where the next request starts (bodies
by Content-Length or chunked); responses are passed through as bytes. A
request that upgrades the connection (exec and attach streams) turns it into
a plain byte pipe both ways.

The socket's directory must be this user's and closed to everyone else
(mode 700): whoever can write it can put a socket of their own in place of
this one, and root's Docker clients would talk to them. Any other
directory is refused.

    python3 docker_api_shim.py --listen SOCKET --engine /var/run/docker.sock --max-version 1.41
"""

import argparse
import asyncio
import os
import re
import signal
import stat
import sys

REQUEST_LINE = re.compile(rb"^(?P<method>\S+) /v(?P<major>\d+)\.(?P<minor>\d+)(?P<rest>/\S*) (?P<protocol>\S+)$")
HEAD_LIMIT = 1 << 20


def lower_version(line: bytes, highest: tuple[int, int]) -> bytes:
    match = REQUEST_LINE.match(line)
    if not match or (int(match["major"]), int(match["minor"])) <= highest:
        return line
    return b"%s /v%d.%d%s %s" % (match["method"], highest[0], highest[1], match["rest"], match["protocol"])


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def forward_body(headers: dict[bytes, bytes], client: asyncio.StreamReader, engine: asyncio.StreamWriter) -> None:
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        while True:
            size_line = await client.readuntil(b"\r\n")
            engine.write(size_line)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailer lines up to the empty line that ends the body.
                while (line := await client.readuntil(b"\r\n")) != b"\r\n":
                    engine.write(line)
                engine.write(b"\r\n")
                return
            engine.write(await client.readexactly(size + 2))
            await engine.drain()
    length = int(headers.get(b"content-length", b"0"))
    while length > 0:
        chunk = await client.read(min(length, 1 << 16))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", length)
        engine.write(chunk)
        length -= len(chunk)
        await engine.drain()


async def serve(client_reader, client_writer, engine_path: str, highest: tuple[int, int]) -> None:
    try:
        engine_reader, engine_writer = await asyncio.open_unix_connection(engine_path, limit=HEAD_LIMIT)
    except OSError:
        client_writer.close()
        return
    responses = asyncio.create_task(pipe(engine_reader, client_writer))
    try:
        while True:
            head = await client_reader.readuntil(b"\r\n\r\n")
            request_line, _, rest = head.partition(b"\r\n")
            headers = {}
            for line in rest.split(b"\r\n"):
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            engine_writer.write(lower_version(request_line, highest) + b"\r\n" + rest)
            if b"upgrade" in headers:
                await engine_writer.drain()
                await asyncio.gather(pipe(client_reader, engine_writer), responses)
                break
            await forward_body(headers, client_reader, engine_writer)
            await engine_writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError, ValueError):
        pass
    finally:
        responses.cancel()
        for writer in (engine_writer, client_writer):
            writer.close()


def refusal(directory: str) -> str | None:
    """Why `directory` may not hold the socket, or None when it may."""
    try:
        info = os.lstat(directory)
    except OSError as error:
        return f"{directory}: {error.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory (a symbolic link?)"
    if info.st_uid != os.geteuid():
        return f"{directory} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & 0o077:
        return f"{directory} has mode {stat.S_IMODE(info.st_mode):o}: others may replace the socket in it (700 wanted)"
    return None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--engine", default="/var/run/docker.sock")
    parser.add_argument("--max-version", required=True, help="the engine's API version, e.g. 1.41")
    args = parser.parse_args()
    major, minor = (int(part) for part in args.max_version.split("."))
    if why := refusal(os.path.dirname(os.path.abspath(args.listen))):
        sys.exit(f"docker_api_shim: refusing to listen there: {why}")
    if os.path.exists(args.listen):
        os.unlink(args.listen)
    server = await asyncio.start_unix_server(
        lambda r, w: serve(r, w, args.engine, (major, minor)), path=args.listen, limit=HEAD_LIMIT
    )
    os.chmod(args.listen, 0o600)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    os.unlink(args.listen)


if __name__ == "__main__":
    asyncio.run(main())
