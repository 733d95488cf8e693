"""Streamed tool calls put back together: a client's view of vLLM's tool_calls deltas (a call's first entry has its
id, type and name with arguments "", later entries only its index and an arguments fragment)."""


def merged_calls(entries: list[dict], whole_first: bool = False) -> list[dict]:
    """The calls the entries add up to, by index ({"id", "name", "arguments"}), checking each entry's shape
    (`whole_first`: a first entry may carry arguments, as harmony's whole calls do)."""
    calls: dict[int, dict] = {}
    for entry in entries:
        index, function = entry["index"], entry["function"]
        if index not in calls:
            assert set(entry) == {"index", "id", "type", "function"} and entry["type"] == "function", entry
            assert (whole_first or function["arguments"] == "") and isinstance(function["name"], str), entry
            calls[index] = {"id": entry["id"], "name": function["name"], "arguments": function["arguments"]}
        else:
            assert set(entry) == {"index", "function"} and set(function) == {"arguments"}, entry
            assert function["arguments"], "an empty fragment is never sent"
            calls[index]["arguments"] += function["arguments"]
    assert sorted(calls) == list(range(len(calls))), "indexes run 0, 1, ... in the order calls begin"
    return [calls[index] for index in range(len(calls))]


def delta_entries(deltas: list[dict]) -> list[dict]:
    """The tool_calls entries of a stream's deltas, in order."""
    return [entry for delta in deltas for entry in delta.get("tool_calls", [])]
