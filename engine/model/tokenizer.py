"""The model directory's tokenizer.json through `tokenizers`, else a byte-level fallback."""

from __future__ import annotations

from pathlib import Path


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; BOS/EOS are ids of the model's vocabulary outside that range."""

    def __init__(self, bos_token_id: int, eos_token_id: int, vocab_size: int):
        if vocab_size < 258 or bos_token_id < 256 or eos_token_id < 256 or bos_token_id == eos_token_id:
            raise ValueError(f"byte tokenizer needs vocab >= 258 and distinct BOS/EOS ids >= 256, got "
                             f"vocab {vocab_size}, bos {bos_token_id}, eos {eos_token_id}")
        self.bos_token_id, self.eos_token_id, self.vocab_size = bos_token_id, eos_token_id, vocab_size

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        # ids >= 256 are special or unused: they have no text
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer.json; encode() applies its own post-processor (e.g. Llama-3 prepends BOS)."""

    def __init__(self, path: str | Path, bos_token_id: int, eos_token_id: int):
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise ValueError(f"{path}: cannot load tokenizer: {e}") from e
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(model_dir: str | Path | None, bos_token_id: int, eos_token_id: int, vocab_size: int):
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        return HFTokenizer(Path(model_dir) / "tokenizer.json", bos_token_id, eos_token_id)
    return ByteTokenizer(bos_token_id, eos_token_id, vocab_size)
