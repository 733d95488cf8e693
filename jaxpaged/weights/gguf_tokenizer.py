"""Child-process entry point: `python -m jaxpaged.weights.gguf_tokenizer FILE.gguf OUT_DIR` saves HF tokenizer files."""

import pathlib
import sys


def main(gguf_path: str, out_dir: str) -> None:
    """Convert the GGUF's tokenizer (transformers does the vocabulary conversion) and save it."""
    from transformers import AutoTokenizer

    path = pathlib.Path(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    main(*sys.argv[1:3])
