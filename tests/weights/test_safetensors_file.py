"""The memory-mapped safetensors reader: values and dtypes as safetensors writes them, clear errors on bad files."""

import json
import shutil
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch
from safetensors.torch import save_file

from jaxpaged.weights.hf_checkpoint import checkpoint_files
from jaxpaged.weights.safetensors_file import open_tensor, read_header


def test_every_float_dtype_reads_back_exactly(tmp_path):
    values = torch.randn(3, 5)
    file = tmp_path / "t.safetensors"
    save_file({"bf16": values.bfloat16(), "f16": values.half(), "f32": values, "scalar": torch.tensor(2.5)}, file)
    entries = read_header(file)
    bf16 = open_tensor(entries["bf16"])
    assert bf16.dtype == ml_dtypes.bfloat16 and not bf16.flags.writeable
    np.testing.assert_array_equal(bf16.astype(np.float32), values.bfloat16().float().numpy())
    np.testing.assert_array_equal(open_tensor(entries["f16"]), values.half().numpy())
    np.testing.assert_array_equal(open_tensor(entries["f32"]), values.numpy())
    assert open_tensor(entries["scalar"]).shape == () and float(open_tensor(entries["scalar"])) == 2.5


def test_quantized_dtypes_are_refused_by_name(tmp_path):
    file = tmp_path / "q.safetensors"
    safetensors.numpy.save_file({"w": np.zeros((2, 2), np.int8)}, str(file))
    with pytest.raises(ValueError, match="tensor 'w' has dtype I8"):
        open_tensor(read_header(file)["w"])


def test_truncated_file_is_reported_as_such(tmp_path):
    file = tmp_path / "t.safetensors"
    save_file({"w": torch.zeros(64, 64)}, file)
    data = file.read_bytes()
    file.write_bytes(data[:-100])
    with pytest.raises(ValueError, match="runs past the end of the file"):
        read_header(file)
    file.write_bytes(data[:5])
    with pytest.raises(ValueError, match="too short"):
        read_header(file)
    file.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_header(file)


def test_index_names_the_shards_and_a_missing_one(tmp_path):
    shard = tmp_path / "model-00001-of-00002.safetensors"
    save_file({"w": torch.zeros(2)}, shard)
    shutil.copy(shard, tmp_path / "consolidated.safetensors")  # another copy of the weights, not in the index
    index = {"weight_map": {"w": shard.name, "v": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="lists model-00002-of-00002.safetensors, which is not there"):
        checkpoint_files(tmp_path)
    shutil.copy(shard, tmp_path / "model-00002-of-00002.safetensors")
    assert [f.name for f in checkpoint_files(tmp_path)] == [shard.name, "model-00002-of-00002.safetensors"]


def write_safetensors(path, header: dict, data: bytes) -> None:
    """A safetensors file with exactly this header (no validation by a writer)."""
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


F32_PAIR = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}


@pytest.mark.parametrize("tensors, message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, r"tensor 'a': data_offsets \[-8, 0\] must be"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}}, r"tensor 'a': data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, r"tensor 'a': data_offsets \[8, 0\] must be"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}}, r"tensor 'a': data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [False, 8]}}, r"tensor 'a': data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, r"tensor 'a': data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, r"tensor 'b' overlaps tensor 'a'"),
    ({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
      "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, r"tensor '[ab]' overlaps tensor '[ab]'"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, r"tensor 'b' overlaps tensor 'a'"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, r"tensor 'b' runs past the end"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}, r"tensor 'a': data_offsets \[0, 12\] span 12 "
                                                                      r"bytes, but F32 of shape \(2,\) is 8 bytes"),
    ({"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 16]}}, r"tensor 'a': .* is 12 bytes"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, r"tensor 'a': unknown dtype 'Q4'"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, r"tensor 'a': shape \[-2\]"),
    ({"a": [0, 8]}, r"tensor 'a': its header entry is not an object"),
], ids=["negative-begin", "negative-end", "reversed", "float-offsets", "bool-offset", "one-offset", "overlapping",
        "out-of-order-overlapping", "nested", "out-of-bounds", "size-mismatch", "bf16-size-mismatch",
        "unknown-dtype", "negative-shape", "entry-not-object"])
def test_bad_data_offsets_are_refused_naming_the_tensor(tmp_path, tensors, message):
    """A header whose byte ranges a reader could be steered by (issue 56 #11) is refused with the tensor's name."""
    file = tmp_path / "bad.safetensors"
    write_safetensors(file, tensors, bytes(16))
    with pytest.raises(ValueError, match=message):
        read_header(file)


def test_well_formed_hand_written_header_reads_in_any_listed_order(tmp_path):
    """Disjoint ranges listed out of order, an empty tensor and __metadata__ are accepted; values read back."""
    file = tmp_path / "ok.safetensors"
    header = {"__metadata__": {"format": "pt"}, "b": F32_PAIR["b"], "a": F32_PAIR["a"],
              "empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]}}
    write_safetensors(file, header, np.arange(4, dtype=np.float32).tobytes())
    entries = read_header(file)
    assert sorted(entries) == ["a", "b", "empty"]
    np.testing.assert_array_equal(open_tensor(entries["b"]), [2.0, 3.0])
    assert open_tensor(entries["empty"]).shape == (0, 3)


def test_oversize_duplicate_or_non_object_headers_are_refused(tmp_path):
    """A header length over the format's 100 MiB limit, a tensor named twice and a non-object header are refused."""
    file = tmp_path / "bad.safetensors"
    file.write_bytes(struct.pack("<Q", 100 * 2**20 + 1) + b"{" + b" " * 64)
    with pytest.raises(ValueError, match="not a safetensors file .*over the format's 100 MiB limit"):
        read_header(file)
    text = '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "a": {"dtype": "F32", "shape": [2], ' \
           '"data_offsets": [8, 16]}}'
    file.write_bytes(struct.pack("<Q", len(text)) + text.encode() + bytes(16))
    with pytest.raises(ValueError, match="tensor 'a' is named twice"):
        read_header(file)
    write_safetensors(file, [1, 2], b"")  # pyright: ignore[reportArgumentType]  (a list where the object belongs)
    with pytest.raises(ValueError, match="not a JSON object"):
        read_header(file)
    file.write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(ValueError, match="header is not JSON"):
        read_header(file)
