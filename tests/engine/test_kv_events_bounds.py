"""What a subscriber can cost the engine through the KV events socket (issue 56, finding 8): the publisher's queue
and each subscriber's share stay under a byte bound, no message is over max_message_bytes, an oversize inbound
frame is refused, and a subscription flood cannot grow the publisher's subscription trie without bound."""

import time

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

from jaxpaged.core.kv_events import KVEventLog  # noqa: E402
from jaxpaged.features.kv_events import encode_batches  # noqa: E402
from jaxpaged.features.kv_events_queue import ByteBoundedQueue  # noqa: E402
from jaxpaged.kv_events_config import parse_kv_events_config  # noqa: E402
from tests.engine.kv_events_sockets import TOPIC, free_endpoint, publisher, receive_while_publishing, subscriber  # noqa: E402

MIB = 1024 * 1024


def resident_mib() -> float:
    """This process's resident memory."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / MIB


def test_queue_drops_the_oldest_past_its_byte_bound():
    """A hand-worked case: a 10-byte bound holds 4+4 bytes, a third message pushes out the first, one message over
    the bound is dropped itself."""
    queue = ByteBoundedQueue(10)
    queue.push((b"aa", b"aa"))
    queue.push((b"bbbb",))
    queue.push((b"cccc",))
    assert (len(queue), queue.queued_bytes, queue.num_dropped, queue.peek()) == (2, 8, 1, (b"bbbb",))
    queue.push((b"x" * 11,))
    assert (len(queue), queue.num_dropped, queue.pop(), queue.queued_bytes) == (2, 2, (b"bbbb",), 4)


def test_hwm_defaults_to_the_byte_bound_over_the_largest_message():
    """SNDHWM x max_message_bytes <= max_queue_bytes: 64 MiB over 256 KiB is 256 messages per subscriber."""
    assert parse_kv_events_config("{}").send_hwm() == 256
    assert parse_kv_events_config('{"max_queue_bytes": 1048576, "max_message_bytes": 65536}').send_hwm() == 16


def test_a_large_step_is_split_into_batches_under_the_bound():
    """A step's events over max_message_bytes go out as several batches of the rank, in order, none over it."""
    log = KVEventLog(block_size=16)
    for index in range(3000):
        log.stored(index.to_bytes(32, "big"), None, tuple(range(70000, 70016)))
    events = log.take()
    payloads = encode_batches(events, 1, 64 * 1024, ts=2.0)
    assert len(payloads) > 1 and max(len(payload) for payload in payloads) <= 64 * 1024
    decoded = [msgpack.unpackb(payload) for payload in payloads]
    assert {(ts, rank) for ts, _, rank in decoded} == {(2.0, 1)}
    hashes = [event["block_hashes"][0] for _, batch, _ in decoded for event in batch]
    assert hashes == [index.to_bytes(32, "big") for index in range(3000)]


def _stall(endpoint: str):
    """A subscriber that subscribes and never reads, with the smallest buffers it can ask for."""
    stalled = zmq.Context.instance().socket(zmq.SUB)
    stalled.setsockopt(zmq.LINGER, 0)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.RCVBUF, 4096)
    stalled.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    stalled.connect(endpoint)
    return stalled


def test_hold_queue_stays_under_its_byte_bound_with_a_stalled_subscriber():
    """"hold": a subscriber that never reads stops the socket; the publisher's queue keeps under max_queue_bytes
    (4 MiB) while 100 MiB are published, dropping (and counting) the oldest."""
    endpoint = free_endpoint()
    pub = publisher(endpoint, slow_subscriber="hold", max_queue_bytes=4 * MIB, max_message_bytes=64 * 1024)
    stalled = _stall(endpoint)
    try:
        assert receive_while_publishing(pub, stalled, b"first", timeout_s=10) is not None  # subscribed
        payload = b"p" * (60 * 1024)
        for _ in range(100 * MIB // len(payload)):
            pub.publish([payload])
            assert pub.queued_bytes <= 4 * MIB
        assert pub.peak_queued_bytes > 3 * MIB and pub.num_dropped > 1000
    finally:
        stalled.close()
        pub.close()


def test_drop_policy_bounds_what_a_stalled_subscriber_pins():
    """"drop" (vLLM's behaviour): 200 MiB published past a subscriber that never reads grow the process by far less
    than that (it pinned 763 MiB before: the high-water mark counted 100,000 messages, not bytes); a subscriber
    that catches up gets the next message."""
    endpoint = free_endpoint()
    pub = publisher(endpoint, max_queue_bytes=8 * MIB, max_message_bytes=64 * 1024)
    stalled, reader = _stall(endpoint), subscriber(endpoint, rcvhwm=4)
    try:
        for sock in (stalled, reader):
            assert receive_while_publishing(pub, sock, b"first", timeout_s=10) is not None
        before = resident_mib()
        payload = b"p" * (60 * 1024)
        for _ in range(200 * MIB // len(payload)):
            pub.publish([payload])
            assert pub.queued_bytes == 0  # the socket takes every message; the stalled one's share is dropped
        time.sleep(0.2)
        assert resident_mib() - before < 48
        while reader.poll(100):  # a reader that catches up is not held back by the stalled one
            reader.recv_multipart()
        last = receive_while_publishing(pub, reader, b"last", timeout_s=10)
        assert last is not None and last[2] == b"last"
    finally:
        stalled.close()
        reader.close()
        pub.close()


def _raw_peer(endpoint: str):
    peer = zmq.Context.instance().socket(zmq.XSUB)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.SNDHWM, 0)
    peer.connect(endpoint)
    return peer


def _serve_for(pub, seconds: float) -> int:
    """Publishes every 10 ms for `seconds`; the most topics the socket's trie held meanwhile."""
    most, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        pub.publish([b"tick"])
        most = max(most, pub._socket.getsockopt(zmq.TOPICS_COUNT))
        time.sleep(0.01)
    return most


def test_an_oversize_inbound_frame_is_refused():
    """A subscription frame over the inbound bound (ZMQ_MAXMSGSIZE) is never applied: its peer is disconnected;
    the same frame at a subscription's size is."""
    endpoint = free_endpoint()
    pub = publisher(endpoint)
    oversize, normal = _raw_peer(endpoint), _raw_peer(endpoint)
    try:
        oversize.send(b"\x01" + b"k" * 64 * 1024)
        _serve_for(pub, 0.5)
        assert (pub.num_subscribed_topics, pub._socket.getsockopt(zmq.TOPICS_COUNT)) == (0, 0)
        normal.send(b"\x01" + b"k" * 100)
        _serve_for(pub, 0.5)
        assert (pub.num_subscribed_topics, pub._socket.getsockopt(zmq.TOPICS_COUNT)) == (1, 1)
    finally:
        oversize.close()
        normal.close()
        pub.close()


def test_a_subscription_flood_leaves_the_publisher_bounded():
    """20,000 distinct topics from one peer: the publisher drops the connections past max_subscriptions (256), so
    its trie never holds the flood, and a real subscriber still reads the events afterwards."""
    endpoint = free_endpoint()
    pub = publisher(endpoint, max_subscriptions=256)
    flooder = _raw_peer(endpoint)
    try:
        for index in range(20_000):
            flooder.send(b"\x01" + f"flood-{index:06d}-padding-padding".encode())
        most = _serve_for(pub, 3.0)
        assert pub.num_resets >= 1 and most < 10_000 and pub.num_subscribed_topics <= 256
    finally:
        flooder.close()
    reader = subscriber(endpoint)
    try:
        assert receive_while_publishing(pub, reader, b"after", timeout_s=10) is not None
    finally:
        reader.close()
        pub.close()
