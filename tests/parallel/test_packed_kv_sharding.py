"""The packed TPU KV layout at tp 1 and tp 2 (2 forced CPU devices, the TPU interpreter): each device's rows of the
runner's sharded pool are its heads' packed pages, and the write and the attention per shard give spec.py's cache and
output, decode-only and mixed steps, at edge lengths (1, page, page + 1, many pages)."""

import pytest

from tests.json_worker import run_json_worker

WORKER_TIMEOUT_S = 300


# One worker per shape (bfloat16: [K | V] in one vector; float32: one kv head per shard), so the two can run side by
# side.
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_packed_pool_per_shard_matches_the_spec_at_tp1_and_tp2(dtype: str):
    results = run_json_worker("tests.parallel.sharded_attention_worker", [dtype], 2, WORKER_TIMEOUT_S)
    assert {(r["dtype"], r["step"], r["tp"]) for r in results} == {
        (dtype, step, tp) for step in ("mixed", "decode") for tp in (1, 2)}
    for result in results:
        case = f"{result['shape']} {result['dtype']} {result['step']} tp={result['tp']}"
        assert result["max_error"] < (3e-2 if result["dtype"] == "bfloat16" else 2e-5), case
        assert result["padding_rows_zero"] and result["written_exact"] and result["other_layer_untouched"], case
        # Split by the runner's spec on the row axis: each device holds 1/tp of every page, its own heads' rows.
        assert result["pool_devices"] == result["tp"] and result["shards_hold_their_rows"], case
        assert result["shard_rows"] * result["tp"] == result["rows"], case
