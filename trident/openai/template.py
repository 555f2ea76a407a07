"""What a text model's folder holds for the OpenAI front end: a chat template and a tokenizer.

* The chat template is ``chat_template.jinja`` in the model folder, else the
  ``"chat_template"`` of the folder's ``tokenizer_config.json`` (the Hugging Face layout; a
  list of named templates picks ``"default"``). It is rendered in Jinja2's immutable sandbox with
  ``messages`` (``role``, ``content``, optional ``name``), ``add_generation_prompt`` (true),
  ``bos_token`` / ``eos_token`` from ``tokenizer_config.json`` and ``raise_exception(message)``
  (an INVALID_ARG for the client). Without one, :func:`default_prompt` applies: one
  ``"<role>: <content>"`` line per message, then ``"assistant:"``.
* The tokenizer is the folder's ``tokenizer.json`` (the ``tokenizers`` package); it counts the
  tokens of ``usage``. Without one, ``usage`` is null.

Loading reads files: call :func:`load_assets` in a worker thread.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trident.errors import Code
from trident.openai.api import OpenAIError, invalid

log = logging.getLogger("trident.openai")

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"
MAX_TEMPLATE_BYTES = 1024 * 1024


def default_prompt(messages: list[dict[str, str]]) -> str:
    """The default chat template: ``"<role>: <content>\\n"`` per message, then ``"assistant:"``."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


class ChatTemplate:
    """A model's Jinja2 chat template, compiled once in the sandbox.

    Raises OpenAIError(INTERNAL) (construction) for a template that does not compile.
    """

    def __init__(self, source: str, special: dict[str, str]) -> None:
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise OpenAIError(Code.INTERNAL, "the model has a chat template: install trident[openai] (jinja2) "
                              "to render it") from None

        def raise_exception(message: str) -> None:
            raise invalid(f"chat template: {message}", "messages")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
        env.globals["raise_exception"] = raise_exception
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise OpenAIError(Code.INTERNAL, f"the model's chat template does not compile: {e}") from None
        self._special = special
        self._errors: tuple[type[BaseException], ...] = (TemplateError,)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt for ``messages``. Raises OpenAIError: INVALID_ARG from ``raise_exception``,
        INTERNAL when rendering fails otherwise."""
        try:
            return str(self._template.render(messages=messages, add_generation_prompt=True, **self._special))
        except OpenAIError:
            raise
        except self._errors as e:
            raise OpenAIError(Code.INTERNAL, f"the model's chat template failed: {e}") from None
        except Exception as e:  # a template error of another kind (TypeError on bad data...)
            raise OpenAIError(Code.INTERNAL, f"the model's chat template failed: {type(e).__name__}: {e}") from None


@dataclass
class Assets:
    """A model folder's chat template (None: the default) and tokenizer (None: no usage)."""

    template: ChatTemplate | None = None
    tokenizer: Any = None
    error: OpenAIError | None = None  # the template could not be loaded: chat requests fail with it

    def prompt(self, messages: list[dict[str, str]]) -> str:
        """The rendered chat prompt. Raises OpenAIError (see :meth:`ChatTemplate.render`)."""
        if self.error is not None:
            raise self.error
        return default_prompt(messages) if self.template is None else self.template.render(messages)

    def count(self, text: str) -> int | None:
        """Tokens in ``text`` (None without a tokenizer)."""
        if self.tokenizer is None:
            return None
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        out[key] = value if isinstance(value, str) else ""
    return out


def _read_text(path: Path) -> str:
    if path.stat().st_size > MAX_TEMPLATE_BYTES:
        raise OpenAIError(Code.INTERNAL, f"{path.name} is larger than {MAX_TEMPLATE_BYTES} bytes")
    return path.read_text(encoding="utf-8")


def load_assets(model_dir: Path | None) -> Assets:
    """Read a model folder's chat template and tokenizer (blocking: run it in a thread).

    Never raises: a template that cannot be read is kept as the error chat requests get; a
    tokenizer that cannot be read is logged and usage is null.
    """
    assets = Assets()
    if model_dir is None:
        return assets
    config: dict[str, Any] = {}
    try:
        config_path = model_dir / TOKENIZER_CONFIG
        if config_path.is_file():
            loaded = json.loads(_read_text(config_path))
            config = loaded if isinstance(loaded, dict) else {}
        source: Any = None
        if (model_dir / TEMPLATE_FILE).is_file():
            source = _read_text(model_dir / TEMPLATE_FILE)
        else:
            source = config.get("chat_template")
            if isinstance(source, list):
                named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
                source = named.get("default")
        if source is not None:
            if not isinstance(source, str):
                raise OpenAIError(Code.INTERNAL, f"the chat_template of {TOKENIZER_CONFIG} is not a string")
            assets.template = ChatTemplate(source, _special_tokens(config))
    except OpenAIError as e:
        assets.error = e
    except (OSError, ValueError) as e:
        assets.error = OpenAIError(Code.INTERNAL, f"the model's chat template cannot be read: {e}")
    if assets.error is not None:
        log.warning("model folder %s: %s", model_dir, assets.error.message)
    tokenizer_path = model_dir / TOKENIZER_FILE
    if tokenizer_path.is_file():
        try:
            from tokenizers import Tokenizer

            assets.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except ImportError:
            log.warning("model folder %s has %s: install trident[openai] (tokenizers) for usage counts",
                        model_dir, TOKENIZER_FILE)
        except Exception as e:  # the tokenizers package raises its own exception type
            log.warning("model folder %s: %s cannot be loaded: %s", model_dir, TOKENIZER_FILE, e)
    return assets
