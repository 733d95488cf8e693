"""Native CPU kernels, built from C++ on first use and called from jitted code through XLA's FFI."""
