"""Optional engine features, plugged into the engine loop through EngineFeature's hooks (base.py).

wiring.py is the one place that imports them: KV tiers below the device (kv_tiers.py over jaxpaged/kv_tiers),
multi-host serving (multihost.py over jaxpaged/multihost) and the prefix-miss advisor (prefix_advisor.py over
jaxpaged/core/prefix_advisor.py). The engine itself only knows the hooks.
"""
