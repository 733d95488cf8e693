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
