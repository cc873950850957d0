# Fixture suite for the grader-parity corpus: every pytest outcome the parsers must read.
import pytest


class MouseButton:
    LEFT = 1
    RIGHT = 3


def test_pass():
    assert 1 + 1 == 2


def test_fail_with_message():
    assert "a - b" == "a b", "values differ - see diff"


@pytest.mark.skip(reason="not on this platform")
def test_skip():
    pass


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False


@pytest.mark.xfail(reason="fixed upstream")
def test_xpass():
    assert True


@pytest.fixture
def broken_fixture():
    raise RuntimeError("fixture exploded")


def test_error_in_fixture(broken_fixture):
    pass


@pytest.mark.parametrize(
    "arg",
    ["plain", "with space", "/usr/lib/python3/site.py", "//net/share", "[nested]", "a*b"],
)
def test_param(arg):
    assert arg != "with space"


@pytest.mark.parametrize("button", [MouseButton.LEFT, MouseButton.RIGHT], ids=["MouseButton.LEFT", "MouseButton.RIGHT"])
def test_mouse(button):
    assert button in (1, 3)


def test_unicode_é():
    assert "é" == "é"
