"""Request bodies of the OpenAI API as vLLM accepts them, and the OpenAI error shape.

Unknown fields are ignored (as vLLM does); wrong types and values outside vLLM's ranges fail
validation and become HTTP 400. Text must be encodable as UTF-8 (JSON can carry lone surrogates).
Fields we parse but do not implement are accepted at their neutral value only (unsupported()),
and so is every other field vLLM accepts that we do not implement (NOT_IMPLEMENTED: logit_bias,
best_of, suffix, beam search, guided decoding, tools, ...): a 400 naming it, never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"character {exc.start} is a lone surrogate (U+{ord(text[exc.start]):04X}), "
                         f"which is not valid UTF-8") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


def _finite(ge: float | None = None, le: float | None = None, gt: float | None = None):
    return Field(None, ge=ge, le=le, gt=gt, allow_inf_nan=False)


def _empty(v) -> bool:
    return v is None or v is False or v == {} or v == []


# vLLM request fields we do not implement -> whether a value is the neutral one (accepted, no effect)
NOT_IMPLEMENTED = {
    "logit_bias": _empty,
    "best_of": lambda v: v is None or v == 1,
    "use_beam_search": _empty,
    "length_penalty": lambda v: v is None or v == 1.0,
    "include_stop_str_in_output": _empty,
    "allowed_token_ids": lambda v: v is None,
    "bad_words": _empty,
    "prompt_logprobs": lambda v: v is None,
    "truncate_prompt_tokens": lambda v: v is None,
    "guided_json": lambda v: v is None,
    "guided_regex": lambda v: v is None,
    "guided_choice": lambda v: v is None,
    "guided_grammar": lambda v: v is None,
    "structured_outputs": lambda v: v is None,
    "response_format": lambda v: v is None or isinstance(v, dict) and v.get("type") == "text",
    "logits_processors": _empty,
    "return_tokens_as_token_ids": _empty,
}
COMPLETION_ONLY = {"suffix": lambda v: v is None}
CHAT_ONLY = {"tools": _empty, "tool_choice": lambda v: v is None or v == "none", "echo": _empty,
             "continue_final_message": _empty}


def _not_implemented(req: BaseModel, table: dict) -> tuple[str, str] | None:
    for name, neutral in table.items():
        value = getattr(req, name)
        if not neutral(value):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "..."
            return name, f"{name} is not supported by this engine, got {shown}"
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = False


class SamplingFields(BaseModel):
    """The fields both endpoints share, with vLLM's ranges (its SamplingParams checks)."""
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    temperature: float | None = _finite(ge=0, le=2)
    top_p: float | None = _finite(gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX)  # -1 and 0 disable it
    min_p: float | None = _finite(ge=0, le=1)
    presence_penalty: float | None = _finite(ge=-2, le=2)
    frequency_penalty: float | None = _finite(ge=-2, le=2)
    repetition_penalty: float | None = _finite(gt=0)
    seed: Int64 | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT64_MAX)]] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=INT64_MAX)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    priority: Int64 = 0
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's P/D fields (engine.kv_transfer)
    logit_bias: Any = None  # NOT_IMPLEMENTED: only their neutral values pass
    best_of: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    include_stop_str_in_output: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    prompt_logprobs: Any = None
    truncate_prompt_tokens: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    response_format: Any = None
    logits_processors: Any = None
    return_tokens_as_token_ids: Any = None

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a valid value this engine does not implement, else None."""
        if (problem := _not_implemented(self, NOT_IMPLEMENTED)) is not None:
            return problem
        if self.n != 1:
            return "n", f"only n=1 is supported, got {self.n}"
        if self.stop is not None and any(s == "" for s in ([self.stop] if isinstance(self.stop, str)
                                                           else self.stop)):
            return "stop", "stop cannot contain an empty string"
        neutral = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                   "repetition_penalty": 1.0, "min_tokens": 0}
        for name, value in neutral.items():
            got = getattr(self, name)
            if got is not None and got != value:
                return name, f"{name} is not supported by this engine (only {value} is accepted), got {got}"
        return None


class CompletionRequest(SamplingFields):
    # tried in this order: a long list of token ids is validated once, not once a branch
    prompt: Text | list[int] | list[Text] | list[list[int]] = Field(union_mode="left_to_right")
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: Any = None

    def unsupported(self) -> tuple[str, str] | None:
        if (problem := _not_implemented(self, COMPLETION_ONLY)) is not None:
            return problem
        if self.echo or self.logprobs is not None:
            param = "echo" if self.echo else "logprobs"
            return param, "echo and logprobs are not supported"
        return super().unsupported()


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"] = "text"
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Text
    content: Text | list[TextPart] | None = None
    name: Text | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Any = None
    tool_choice: Any = None
    echo: Any = None
    continue_final_message: Any = None

    def unsupported(self) -> tuple[str, str] | None:
        if (problem := _not_implemented(self, CHAT_ONLY)) is not None:
            return problem
        if self.logprobs:
            return "logprobs", "logprobs are not supported"
        return super().unsupported()


class APIError(Exception):
    """An error with its HTTP status, rendered as {"error": {...}} like OpenAI's API."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict:
        return error_body(self.message, self.type, self.status, self.param)


def error_body(message: str, type_: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def message_text(msg: ChatMessage) -> str:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    return "".join(p.text for p in msg.content)


def apply_chat_template(messages: list[ChatMessage]) -> str:
    """A plain built-in template (our tokenizers carry none): one turn a line block, then the cue."""
    turns = [f"<|{m.role}|>\n{message_text(m)}\n" for m in messages]
    return "".join(turns) + "<|assistant|>\n"
