"""Chat formatting in token space, derived from the tokenizer's own chat template.

The initial prompt is rendered once with ``apply_chat_template``.  Later turns
append only the *delta* an observation adds (end of the assistant message, the
user message, the generation prompt), found once from the template with
placeholders.  The sampled response tokens are never decoded and re-encoded,
so the context stays exactly what the policy produced (token-in-token-out).
"""

from __future__ import annotations

from typing import Sequence

_A = "\u0001ASSISTANT\u0001"
_O = "\u0001OBSERVATION\u0001"


class ChatPrompter:
    def __init__(self, tokenizer, system_prompt: str | None = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat_template; set one before building a prompter")
        self.tok = tokenizer
        self.system_prompt = system_prompt
        head = self._messages("first")
        base = self._render(head + [{"role": "assistant", "content": _A}], gen=False)
        full = self._render(head + [{"role": "assistant", "content": _A},
                                    {"role": "user", "content": _O}], gen=True)
        if not full.startswith(base) or _A not in base:
            raise ValueError("chat template does not render conversations prefix-consistently")
        closing = base[base.index(_A) + len(_A):]  # e.g. "<|im_end|>\n"
        delta = full[len(base):]
        pre, post = delta.split(_O)
        eos = tokenizer.eos_token or ""
        at = closing.find(eos) if eos else -1
        # a response that stopped on eos already ends with it: only what follows is missing
        # (one that stopped on another stop id, e.g. <|endoftext|> or <|eom_id|>, or was
        # cut off, gets the whole closing)
        closes = at >= 0 and not closing[:at].strip()
        self._eos_id = tokenizer.eos_token_id if closes else None
        self._after_eos = closing[at + len(eos):] if closes else closing
        self._closing = closing
        self._pre, self._post = pre, post

    def _messages(self, observation: str) -> list[dict]:
        msgs = []
        if self.system_prompt:
            msgs.append({"role": "system", "content": self.system_prompt})
        msgs.append({"role": "user", "content": observation})
        return msgs

    def _render(self, messages: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def initial_ids(self, observation: str) -> list[int]:
        """System prompt + first observation + generation prompt."""
        return self._encode(self._render(self._messages(observation), gen=True))

    def observation_ids(self, observation: str, response: Sequence[int]) -> list[int]:
        """Tokens appended after ``response`` (the assistant's tokens): the rest of the
        assistant turn's closing, then the observation as a user message and the
        generation prompt."""
        ended = self._eos_id is not None and len(response) and response[-1] == self._eos_id
        closing = self._after_eos if ended else self._closing
        return self._encode(closing + self._pre + observation + self._post)

    def render_ids(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)
