"""MarkerSearch: str.find over a text that grows, resumed where the last search stopped.

The stream parsers (tool calls, reasoning) look for markers in a model's text at every step; searching from the
start each time made a stream quadratic. A search remembers where a match could still begin: past what it has
read, or at a marker cut off at the end of the text (which the next step may complete).
"""

import os


class MarkerSearch:
    """Incremental str.find of markers that share a prefix, in a growing text: one pass finds any of them, and
    the search remembers where a match could still begin."""

    def __init__(self, *markers: str) -> None:
        self.markers = markers
        self._prefix = os.path.commonprefix(list(markers))
        assert self._prefix, "markers searched together share a prefix"
        self.resume = 0
        """No match starts in front of this (beyond the `start` a caller asks for); after a failed search, where
        a marker cut off at the end of the text begins (the text's length when none is)."""
        self.found = ""
        """The marker the last successful find() found."""
        self.num_scanned = 0

    def find(self, text: str, start: int) -> int:
        """The first match of any marker at or after `start`, or -1 (then `resume` is at a cut-off match)."""
        begin = position = max(start, self.resume)
        while (position := text.find(self._prefix, position)) >= 0:
            for marker in self.markers:
                if text.startswith(marker, position):
                    self.num_scanned += position + len(marker) - begin
                    self.resume, self.found = position, marker
                    return position
            if any(len(text) - position < len(marker) and marker.startswith(text[position:])
                   for marker in self.markers):
                self.num_scanned += len(text) - begin
                self.resume = position  # a marker cut off at the end
                return -1
            position += 1
        self.num_scanned += len(text) - begin
        self.resume = self._partial_start(text, begin)
        return -1

    def _partial_start(self, text: str, begin: int) -> int:
        """The first position from `begin` where the rest of the text is a proper prefix of the shared prefix."""
        prefix = self._prefix
        position = max(begin, len(text) - len(prefix) + 1)
        self.num_scanned += len(text) - position
        while (position := text.find(prefix[0], position)) >= 0:
            if prefix.startswith(text[position:]):
                return position
            position += 1
        return len(text)
