"""What every placeholder does when a test uses it: skip the test as not
applicable (it needs an internal of Uber's Fiber that fiber does not have)."""


def not_applicable(what):
    import pytest
    pytest.skip("not applicable: the test uses %s, an internal of Uber's "
                "Fiber that fiber does not have" % what)
