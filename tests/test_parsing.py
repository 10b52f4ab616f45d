import pytest

from turngym.agents.parsing import parse_action

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("text,action", [
    ("<action>go to cabinet 1</action>", "go to cabinet 1"),
    ("<action> go   to\ncabinet 1 </action> <|end|>", "go to cabinet 1"),
    ("<think>the apple is likely in the fridge</think><action>go to fridge 1</action>",
     "go to fridge 1"),
    ("blah blah <action>look</action> trailing", "look"),
])
def test_valid_outputs(text, action):
    p = parse_action(text)
    assert p.ok and p.action == action


@pytest.mark.parametrize("text,error", [
    ("go to cabinet 1", "no <action> tag"),
    ("<action>go to cabinet 1", "unterminated <action> tag"),
    ("<action></action>", "empty action"),
    ("<action>   </action>", "empty action"),
    ("<action>look</action><action>inventory</action>", "more than one <action> tag"),
    ("<action>go <think>x</think></action>", "nested tag inside <action>"),
    ("", "no <action> tag"),
])
def test_invalid_outputs_never_raise(text, error):
    p = parse_action(text)
    assert not p.ok and p.action is None and p.error == error


def test_require_think_and_length_and_non_text():
    assert parse_action("<action>look</action>", require_think=True).error == "missing <think> block"
    assert parse_action("<think>x</think><action>look</action>", require_think=True).ok
    assert parse_action("<action>" + "a" * 600 + "</action>").error == "action too long"
    assert parse_action(None).error == "output is not text"  # type: ignore[arg-type]
