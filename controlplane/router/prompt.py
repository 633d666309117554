"""What the router reads of a request body: its prompt's prefix hashes and its size in tokens.

With a known tokenizer the prompt is tokenized as the engine does it and hashed with the engine
block manager's chained hash over `block` tokens (so with block = the engine's block size, the
router's hashes are the engine's cache keys); without one, the same chain runs over `block`-byte
blocks of the text. Chat messages are rendered with the engine's built-in template first.
"""

from __future__ import annotations

from typing import Any

from routing.prefix import prefix_hashes, text_hashes

CHARS_PER_TOKEN = 4  # the size estimate of a prompt without a tokenizer


class ByteTokenizer:
    """The engine's byte-level tokenizer (the tiny preset and emulated engines): BOS, then UTF-8 bytes."""

    def __init__(self, bos_token_id: int = 256):
        self.bos = bos_token_id
        self.offset = 0 if bos_token_id >= 256 else bos_token_id + 2  # bytes follow BOS and EOS

    def encode(self, text: str) -> list[int]:
        return [self.bos, *(self.offset + b for b in text.encode("utf-8"))]


class JsonTokenizer:
    """A tokenizer.json through the `tokenizers` library."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(path)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids


def load_tokenizer(spec: str | None, bos_token_id: int = 256):
    if spec is None:
        return None
    return ByteTokenizer(bos_token_id) if spec == "byte" else JsonTokenizer(spec)


def chat_text(messages: list) -> str:
    """The engine's built-in chat template: one `<|role|>` block a turn, then the assistant cue."""
    turns = []
    for m in messages:
        content = m.get("content", "") if isinstance(m, dict) else ""
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        role = m.get("role", "") if isinstance(m, dict) else ""
        turns.append(f"<|{role}|>\n{content or ''}\n")
    return "".join(turns) + "<|assistant|>\n"


def request_prompt(body: dict[str, Any], chat: bool) -> str | list[int] | None:
    """The prompt text (or token ids) of a completions or chat body; None when it has none we read."""
    if chat:
        messages = body.get("messages")
        return chat_text(messages) if isinstance(messages, list) else None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
        return prompt
    return None


class PromptReader:
    """Prefix hashes and a token count of a prompt (with a tokenizer: exact; else estimated)."""

    def __init__(self, tokenizer=None, block: int = 64, hashes: bool = True):
        self.tokenizer, self.block, self.hashes = tokenizer, block, hashes

    def read(self, prompt: str | list[int] | None) -> tuple[list[int], int]:
        if prompt is None:
            return [], 0
        if isinstance(prompt, list):  # token ids: the engine's cache keys whatever the tokenizer
            return (prefix_hashes(prompt, self.block) if self.hashes else []), len(prompt)
        if self.tokenizer is not None:
            ids = self.tokenizer.encode(prompt)
            return (prefix_hashes(ids, self.block) if self.hashes else []), len(ids)
        return (text_hashes(prompt, self.block) if self.hashes else []), len(prompt) // CHARS_PER_TOKEN + 1
