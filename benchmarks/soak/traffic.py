"""The soak's clients: normal streams that time their tokens, and the hostile kinds, each a loop until a deadline.

Every loop records what it saw in a Tally: each response's status (5xx is the soak's failure), statuses other
than the one its kind expects, and the normal streams' inter-token gaps. Everything runs on one asyncio loop.
"""

import asyncio
import collections
import dataclasses
import json
import socket
import time

import httpx

COMPLETIONS = "/v1/completions"
NORMAL_MAX_TOKENS = 32
SLOW_READER_MAX_TOKENS = 256
SLOW_READER_HOLD_S = 8.0
"""How long a slow reader keeps its stream open without reading a byte of it."""
HOSTILE_PAUSE_S = 0.25
"""Each hostile loop waits this long between attempts: the hostile load is steady, not a flood."""


@dataclasses.dataclass
class Tally:
    """What the clients saw in one phase."""

    statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """Responses per HTTP status (0: the connection failed before a status arrived)."""
    unexpected: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """(client kind, status) pairs whose status is not what that kind should get."""
    inter_token_s: list[float] = dataclasses.field(default_factory=list)
    """Gaps between consecutive token events of the normal streams, in seconds."""
    num_streams: int = 0
    """Normal streams that finished."""

    def record(self, kind: str, status: int, expected: int) -> None:
        self.statuses[status] += 1
        if status != expected:
            self.unexpected[f"{kind}:{status}"] += 1

    @property
    def num_5xx(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)


def completion_body(prompt, max_tokens: int, stream: bool) -> dict:
    return dict(prompt=prompt, max_tokens=max_tokens, stream=stream, temperature=0.0, ignore_eos=True)


async def normal_streams(client: httpx.AsyncClient, tally: Tally, deadline: float, index: int) -> None:
    """Stream completions one after another, recording the gap between each two token events."""
    while time.monotonic() < deadline:
        body = completion_body(f"Stream {index}: tell me about the sea.", NORMAL_MAX_TOKENS, True)
        async with client.stream("POST", COMPLETIONS, json=body) as response:
            last = None
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                now = time.monotonic()
                if last is not None:
                    tally.inter_token_s.append(now - last)
                last = now
            tally.record("normal", response.status_code, 200)
        tally.num_streams += 1


async def slow_reader(host: str, port: int, tally: Tally, deadline: float) -> None:
    """Ask for a long stream on a socket with a tiny receive buffer, read its first bytes, then read nothing for
    SLOW_READER_HOLD_S (the server's writes back up), then hang up."""
    body = json.dumps(completion_body("A slow reader's long story:", SLOW_READER_MAX_TOKENS, True)).encode()
    request = (f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
            writer.write(request)
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), timeout=60)
            tally.record("slow_reader", int(status_line.split()[1]), 200)
            await asyncio.sleep(min(SLOW_READER_HOLD_S, max(deadline - time.monotonic(), 0.0)))
            writer.close()
        except (TimeoutError, OSError, IndexError, ValueError):  # refused, timed out, a garbled status line
            tally.record("slow_reader", 0, 200)
            sock.close()


async def disconnects(client: httpx.AsyncClient, tally: Tally, deadline: float) -> None:
    """Hang up mid-stream after two events, and give up on a non-streaming request before its answer."""
    while time.monotonic() < deadline:
        body = completion_body("Disconnect me after two tokens.", SLOW_READER_MAX_TOKENS, True)
        async with client.stream("POST", COMPLETIONS, json=body) as response:
            tally.record("disconnect_stream", response.status_code, 200)
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("data: {")
                if seen == 2:
                    break  # leaving the block closes the connection mid-stream
        try:
            await client.post(COMPLETIONS, json=completion_body("Never mind.", SLOW_READER_MAX_TOKENS, False),
                              timeout=0.3)
        except httpx.TimeoutException:
            pass  # the client gave up: that is the point
        await asyncio.sleep(HOSTILE_PAUSE_S)


def _bad_requests() -> list[tuple[str, dict, int]]:
    """(kind, httpx.post keyword arguments, the status it must get)."""
    oversized = json.dumps(completion_body("x" * (3 * 2**20), 4, False))  # over the 2 MiB default body limit
    many = json.dumps(completion_body(["hello"] * 2000, 1, False))  # over the 1,024 prompts per request
    return [
        ("oversized_body", dict(content=oversized, headers={"Content-Type": "application/json"}), 413),
        ("invalid_json", dict(content=b'{"prompt": "unterminated', headers={"Content-Type": "application/json"}),
         400),
        ("too_many_prompts", dict(content=many, headers={"Content-Type": "application/json"}), 400),
        ("wrong_content_type", dict(content=json.dumps(completion_body("hi", 4, False)),
                                    headers={"Content-Type": "text/plain"}), 415),
        ("wrong_types", dict(json={"prompt": 7, "max_tokens": "many"}), 400),
    ]


async def bad_requests(client: httpx.AsyncClient, tally: Tally, deadline: float) -> None:
    """Every kind of refused request in turn: each must get its 4xx, none a 5xx."""
    kinds = _bad_requests()
    while time.monotonic() < deadline:
        for kind, arguments, expected in kinds:
            try:
                response = await client.post(COMPLETIONS, **arguments)
                tally.record(kind, response.status_code, expected)
            except httpx.TransportError:
                tally.record(kind, 0, expected)
            await asyncio.sleep(HOSTILE_PAUSE_S)


async def run_phase(base_url: str, seconds: float, num_normal: int, hostile: bool) -> Tally:
    """Normal streams for `seconds`, with the hostile loops alongside when `hostile`."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    assert port is not None
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        tasks = [normal_streams(client, tally, deadline, index) for index in range(num_normal)]
        if hostile:
            tasks += [slow_reader(host, port, tally, deadline) for _ in range(2)]
            tasks += [disconnects(client, tally, deadline), bad_requests(client, tally, deadline)]
        await asyncio.gather(*tasks)
    return tally
