"""The host-path benchmark (issue 46): `python -m benchmarks.host_path`. cases.py runs a real engine over the stub
device of stub_device.py and records each host phase per step; report.py prints, tabulates, plots and checks."""
