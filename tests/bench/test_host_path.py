"""The host-path benchmark (benchmarks/host_path): a small run end to end on its stub device reports every host
phase, offline and the server's way; a constrained case keeps its grammars for the whole measurement (the run
refuses to report a batch that shrank); the targets are checked against the run's own figures."""

import json

from benchmarks.host_path import report
from benchmarks.host_path.__main__ import main


def test_a_small_run_reports_every_phase_offline_and_through_the_server_loop(tmp_path, capsys):
    out = tmp_path / "results"
    config = tmp_path / "host_path.yaml"
    config.write_text(
        "steps: 6\ndevice_step_ms: 1.0\nmax_model_len: 256\ntargets: {decode_8: 1000.0}\n"
        "cases:\n"
        "  - {requests: [8], loop: [sync, async]}\n"
        "  - {requests: [8], loop: [async], json_schema_fraction: 0.5}\n"
        "  - {requests: [8], loop: [sync], stream: true}\n")
    main(["--config", str(config), "--out", str(out)])

    document = json.loads((out / "results.json").read_text())
    labels = [result["label"] for result in document["results"]]
    assert labels == ["sync 8", "async 8", "async 8 json 0.5", "sync 8 stream"]
    for result in document["results"]:
        summary = result["summary_ms"]
        for phase in ("schedule_s", "prepare_s", "launch_s", "readback_s", "process_s", "host_s"):
            assert summary[phase][0] > 0.0, (result["label"], phase)
        assert summary["host_s"][0] >= summary["process_s"][0] + summary["launch_s"][0]
    assert "deliver_s" in document["results"][3]["summary_ms"]  # the server's hand-over, streamed cases only
    assert "deliver_s" not in document["results"][0]["summary_ms"]
    # The sync loop waits out what is left of the 1 ms stub step after its own launch work (how much is left depends
    # on the machine's load: not a figure to assert).
    assert document["results"][0]["summary_ms"]["device_wait_s"][0] > 0.0
    assert document["targets"] == ["PASS decode_8: " + f"{document['results'][0]['summary_ms']['host_s'][0]:.3f}"
                                   " ms (target <= 1000 ms)"]
    assert (out / "phases.png").stat().st_size > 0 and "| sync 8 |" in (out / "results.md").read_text()
    assert "PASS decode_8" in capsys.readouterr().out


def test_targets_pass_and_fail_on_the_run_s_own_figures():
    def result(label, host, exposed=None):
        summary = {"host_s": (host, host * 2), "exposed_s": (host if exposed is None else exposed, 0.0)}
        return {"label": label, "summary_ms": summary}

    results = [result("sync 256", 1.2), result("sync 256 json 0.1", 2.6), result("async 256", 1.0, exposed=0.1),
               result("sync 512", 3.5)]
    lines = report.check_targets(results, {"decode_256": 1.5, "decode_512": 3.0, "exposed_async_256": 0.2,
                                           "decode_64": 1.0})
    assert lines == ["PASS decode_256: 1.200 ms (target <= 1.5 ms)", "FAIL decode_512: 3.500 ms (target <= 3 ms)",
                     "PASS exposed_async_256: 0.100 ms (target <= 0.2 ms)", "SKIP decode_64: the run has no such case",
                     "FAIL json_256_vs_decode: 2.17x (target <= 2x)"]
