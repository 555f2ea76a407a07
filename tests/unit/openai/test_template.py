"""Chat templates and tokenizers from a model folder (trident.openai.template)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from trident.errors import Code
from trident.openai.api import OpenAIError
from trident.openai.template import ChatTemplate, default_prompt, load_assets

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_default_template() -> None:
    assert default_prompt(MESSAGES) == "system: be brief\nuser: hi\nassistant:"
    assets = load_assets(None)
    assert assets.prompt(MESSAGES) == default_prompt(MESSAGES) and assets.count("x") is None


def test_template_file_wins_over_tokenizer_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "config {{ messages | length }}", "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    assert load_assets(tmp_path).prompt(MESSAGES) == "config 2"
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}")
    assert load_assets(tmp_path).prompt(MESSAGES) == "<s>[system]be brief[user]hi[assistant]</s>"


def test_named_templates_pick_default(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}))
    assert load_assets(tmp_path).prompt(MESSAGES) == "plain"


def test_template_errors() -> None:
    with pytest.raises(OpenAIError) as info:
        ChatTemplate("{% for %}", {})
    assert info.value.code is Code.INTERNAL
    raising = ChatTemplate("{{ raise_exception('roles must alternate') }}", {})
    with pytest.raises(OpenAIError) as info:
        raising.render(MESSAGES)
    assert info.value.code is Code.INVALID_ARG and "roles must alternate" in info.value.message
    sandboxed = ChatTemplate("{{ messages.__class__.__mro__ }}", {})  # the sandbox refuses internals
    with pytest.raises(OpenAIError) as info:
        sandboxed.render(MESSAGES)
    assert info.value.code is Code.INTERNAL


def test_broken_template_is_the_chat_error(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{% if %}")
    assets = load_assets(tmp_path)
    with pytest.raises(OpenAIError, match="does not compile"):
        assets.prompt(MESSAGES)


def test_tokenizer_counts(tmp_path: Path) -> None:
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert load_assets(tmp_path).count("hello world again") == 3
    (tmp_path / "tokenizer.json").write_text("not json")
    assert load_assets(tmp_path).tokenizer is None  # logged; usage is null
