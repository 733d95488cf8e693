"""The hostile-client suite: issue 56's attacks, each against a live server, each followed by a normal request.

Every file here starts its own server (`live_server.LiveServer`) with the flags its attacks need; they share the
session's XLA cache, so only the first one compiles.
"""
