"""The ZeroMQ socket the KV events go out on, with what keeps an untrusted peer from reading them or exhausting
the engine's memory through it (issue 56).

- Who reads: with curve_secret_key_file, the socket is a CURVE server and a ZAP handler (zmq.auth's
  ThreadAuthenticator, on a context of the publisher's own) admits only the public keys in
  curve_authorized_keys_dir; a client without one completes no handshake and gets nothing. Without CURVE, events
  that can leave the machine (a tcp address off loopback) are logged as a warning at start-up.
- What a stalled subscriber pins: SNDHWM is counted so that hwm x max_message_bytes <= max_queue_bytes, and no
  message is over max_message_bytes (features/kv_events.py splits a step's batch); the publisher's own queue holds
  at most max_queue_bytes (kv_events_queue.py).
- What a peer can send: the socket is an XPUB, so the subscriptions reach the publisher, which counts the distinct
  topics; past max_subscriptions it drops every connection (the subscription trie is freed with the socket) and
  binds again, and the subscribers reconnect. ZMQ_MAXMSGSIZE disconnects a peer that sends a frame over a
  subscription's size, and RCVHWM bounds what waits unread from each peer.
"""

import logging
import time
from typing import Any

from jaxpaged.features.kv_events_queue import ByteBoundedQueue
from jaxpaged.kv_events_config import KVEventsConfig

logger = logging.getLogger(__name__)

_INBOUND_SLACK_BYTES = 1024
"""Inbound frames are subscriptions (a flag byte and a topic) and handshake commands: the topic's length plus this."""
_INBOUND_HWM = 64
"""Subscription frames that may wait unread per peer."""
_REBIND_TIMEOUT_S = 2.0
"""How long a reset waits for the closed socket's address to be free again."""


class ZmqEventPublisher:
    """An XPUB socket sending each message as (topic, sequence number, payload), bounded as described above."""

    def __init__(self, config: KVEventsConfig) -> None:
        import zmq

        self._zmq = zmq
        self._config = config
        self._endpoint = config.resolved_endpoint()
        self._topic = config.topic.encode()
        self._curve_keys = _load_curve_keys(config) if config.curve_secret_key_file is not None else None
        # NOTE: a ZAP handler is one per context, so CURVE gets a context of its own; without CURVE the shared one
        # lets an inproc:// subscriber in the same process connect.
        self._context: Any = zmq.Context() if self._curve_keys else zmq.Context.instance()
        self._authenticator: Any = None
        if self._curve_keys is not None:
            from zmq.auth.thread import ThreadAuthenticator

            self._authenticator = ThreadAuthenticator(self._context, log=logger)
            self._authenticator.start()
            self._authenticator.configure_curve(domain="*", location=config.curve_authorized_keys_dir)
        elif config.leaves_loopback():
            shown = ("which blocks are cached (redacted: no token ids, no salts)" if config.redact
                     else "every prompt's and answer's token ids and cache salt")
            logger.warning("KV events are published on %s without authentication: anyone who reaches it reads %s; "
                           "set curve_secret_key_file and curve_authorized_keys_dir in --kv-events-config",
                           self._endpoint, shown)
        self._queue = ByteBoundedQueue(config.max_queue_bytes)
        self._subscribed_topics: set[bytes] = set()
        self._sequence = 0
        self.num_resets = 0
        """Times a subscription flood made the publisher drop every connection."""
        try:
            self._socket: Any = self._open_socket()
        except ValueError:
            self._stop_authenticator()
            raise

    @property
    def num_dropped(self) -> int:
        """Messages the publisher's queue dropped (past max_queue_bytes while the socket would not take them)."""
        return self._queue.num_dropped

    @property
    def queued_bytes(self) -> int:
        """The bytes in the publisher's own queue now."""
        return self._queue.queued_bytes

    @property
    def peak_queued_bytes(self) -> int:
        """The most bytes the publisher's own queue ever held."""
        return self._queue.peak_bytes

    @property
    def num_subscribed_topics(self) -> int:
        """The distinct topics subscribed to now, as the socket reported them."""
        return len(self._subscribed_topics)

    def _open_socket(self) -> Any:
        zmq, config = self._zmq, self._config
        socket = self._context.socket(zmq.XPUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, config.send_hwm())
        socket.setsockopt(zmq.RCVHWM, _INBOUND_HWM)
        socket.setsockopt(zmq.MAXMSGSIZE, len(self._topic) + _INBOUND_SLACK_BYTES)
        socket.setsockopt(zmq.XPUB_NODROP, int(config.slow_subscriber == "hold"))
        if "[" in self._endpoint:
            socket.setsockopt(zmq.IPV6, 1)
        if self._curve_keys is not None:
            socket.curve_publickey, socket.curve_secretkey = self._curve_keys
            socket.curve_server = True
        if not config.binds():
            socket.connect(self._endpoint)
            return socket
        deadline = time.monotonic() + _REBIND_TIMEOUT_S
        while True:
            try:
                socket.bind(self._endpoint)
                return socket
            except zmq.ZMQError as error:
                # After a reset the closed socket releases its address asynchronously (ZeroMQ's reaper thread).
                if error.errno != zmq.EADDRINUSE or time.monotonic() > deadline or not self.num_resets:
                    socket.close(linger=0)
                    raise ValueError(f"kv_events_config: endpoint {self._endpoint!r} cannot be bound ({error})") \
                        from None
                time.sleep(0.01)

    def publish(self, payloads: list[bytes]) -> None:
        """Queues each payload as a message and sends what the socket takes now; never blocks the engine."""
        self._read_subscriptions()
        for payload in payloads:
            self._queue.push((self._topic, self._sequence.to_bytes(8, "big"), payload))
            self._sequence += 1
        self.flush()

    def flush(self) -> None:
        """Sends queued messages, oldest first, until the socket refuses one ("hold": a subscriber is full)."""
        while len(self._queue):
            try:
                self._socket.send_multipart(self._queue.peek(), flags=self._zmq.NOBLOCK)
            except self._zmq.Again:
                return
            self._queue.pop()

    def _read_subscriptions(self) -> None:
        """Counts the distinct subscribed topics (XPUB reports the first subscriber of a topic and the last one to
        leave it); a peer that floods them, or floods frames of any kind, gets every connection dropped."""
        zmq = self._zmq
        max_topics = self._config.max_subscriptions
        for _ in range(4 * max_topics + 4 * _INBOUND_HWM):
            try:
                frame = self._socket.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                self._subscribed_topics.add(frame[1:])
            elif frame[:1] == b"\x00":
                self._subscribed_topics.discard(frame[1:])
            if len(self._subscribed_topics) > max_topics:
                break
        self._reset(f"more than {max_topics} distinct topics subscribed, or a flood of frames")

    def _reset(self, reason: str) -> None:
        self.num_resets += 1
        if self.num_resets & (self.num_resets - 1) == 0:  # the 1st, 2nd, 4th, ...: a flood cannot flood the log
            logger.warning("KV events: %s on %s; dropping every subscriber connection (they reconnect; %d times "
                           "so far)", reason, self._endpoint, self.num_resets)
        self._socket.close(linger=0)
        self._subscribed_topics.clear()
        self._socket = self._open_socket()

    def close(self) -> None:
        """Sends what the socket takes now, then closes it (and the CURVE authenticator)."""
        self.flush()
        self._socket.close(linger=1000)
        self._stop_authenticator()

    def _stop_authenticator(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
            self._context.term()


def _load_curve_keys(config: KVEventsConfig) -> tuple[bytes, bytes]:
    """The publisher's (public, secret) CURVE keys; ValueError naming the field when they cannot be used."""
    import os

    import zmq.auth

    path, directory = config.curve_secret_key_file, config.curve_authorized_keys_dir
    assert path is not None, "called only with curve_secret_key_file set"
    if not zmq.has("curve"):
        raise ValueError("kv_events_config: curve_secret_key_file is set but this libzmq has no CURVE support")
    if directory is None or not os.path.isdir(directory):
        raise ValueError(f"kv_events_config: curve_authorized_keys_dir {directory!r} is not a directory")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"kv_events_config: curve_secret_key_file {path!r} cannot be read ({error})") from None
    if secret is None:
        raise ValueError(f"kv_events_config: curve_secret_key_file {path!r} holds no secret key (give the "
                         ".key_secret file, not the public .key)")
    return public, secret
