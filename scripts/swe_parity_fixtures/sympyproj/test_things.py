# Fixture tests for the sympy-format runner.
def test_good():
    assert 1 == 1


def test_bad():
    assert 1 == 2


def test_raises():
    raise KeyError("x")
