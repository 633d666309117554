"""The model directory's tokenizer.json through `tokenizers`, else a byte-level fallback."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# bytes encoded per C call: fast, yet short enough (about a millisecond) that a thread tokenizing a
# huge prompt hands the interpreter to the event loop between calls
_CHUNK = 1 << 16


class ByteTokenizer:
    """UTF-8 bytes as ids, BOS prepended; BOS/EOS are the model's own ids.

    Bytes take ids 0..255 when BOS/EOS lie above that range (our presets), else the 256 ids right after
    them (as SentencePiece's byte-fallback tokens do after <unk>, <s>, </s>).
    """

    def __init__(self, bos_token_id: int, eos_token_id: int, vocab_size: int):
        if bos_token_id == eos_token_id:
            raise ValueError(f"byte tokenizer needs distinct BOS and EOS ids, got {bos_token_id} for both")
        self.offset = 0 if min(bos_token_id, eos_token_id) >= 256 else max(bos_token_id, eos_token_id) + 1
        if self.offset + 256 > vocab_size:
            raise ValueError(f"byte tokenizer needs ids {self.offset}..{self.offset + 255} for bytes, "
                             f"but the vocabulary has only {vocab_size}")
        self.bos_token_id, self.eos_token_id, self.vocab_size = bos_token_id, eos_token_id, vocab_size

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        ids = [self.bos_token_id]
        for start in range(0, len(data), _CHUNK):
            chunk = data[start:start + _CHUNK]
            if self.offset == 0:
                ids.extend(chunk)  # a bytes object iterates as its byte values
            else:
                ids.extend((np.frombuffer(chunk, np.uint8).astype(np.int64) + self.offset).tolist())
        return ids

    def decode(self, ids: list[int]) -> str:
        # ids outside the byte range are special or unused: they have no text
        o = self.offset
        return bytes(i - o for i in ids if o <= i < o + 256).decode("utf-8", errors="replace")


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
