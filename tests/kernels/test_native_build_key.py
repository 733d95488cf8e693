"""The native kernels' build cache (jaxpaged/kernels/cpu_native/native_build.py) keys a library by everything that
shapes it: a header beside the source (which the source may include) changes the key as the source itself does, so
no stale build is loaded after either is edited."""

from jaxpaged.kernels.cpu_native.native_build import _build_key


def test_the_key_follows_the_source_and_the_headers_beside_it(tmp_path):
    source, header = tmp_path / "kernel.cc", tmp_path / "helpers.h"
    source.write_text('#include "helpers.h"\nint f() { return g(); }\n')
    header.write_text("inline int g() { return 1; }\n")
    flags = ("-O2",)
    key = _build_key(source, flags, "g++")
    assert _build_key(source, flags, "g++") == key  # stable
    header.write_text("inline int g() { return 2; }\n")
    edited_header = _build_key(source, flags, "g++")
    assert edited_header != key
    source.write_text('#include "helpers.h"\nint f() { return g() + 1; }\n')
    assert _build_key(source, flags, "g++") not in (key, edited_header)
    assert _build_key(source, ("-O3",), "g++") != _build_key(source, flags, "g++")
