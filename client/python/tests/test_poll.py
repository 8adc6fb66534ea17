"""The test suite's own wait, ``conftest.poll``: every test that waits goes
through it, so a wait that cannot fail would hide what it waits for."""

from __future__ import annotations

import pytest

from conftest import poll


def test_a_wait_that_times_out_fails_the_test():
    with pytest.raises(pytest.fail.Exception, match="timed out after 0.2 s waiting for never"):
        poll("never", lambda: False, 0.2)


def test_a_wait_on_something_that_died_fails_at_once():
    with pytest.raises(pytest.fail.Exception, match="gone while waiting for x"):
        poll("x", lambda: False, 10, died=lambda: "gone")


def test_without_fail_it_answers_whether_the_check_held():
    assert poll("never", lambda: False, 0.1, fail=False) is False
    n = []
    assert poll("third", lambda: n.append(1) or len(n) >= 3, 5) is True


def test_an_error_of_the_check_is_raised_unless_it_means_not_yet():
    with pytest.raises(ZeroDivisionError):
        poll("boom", lambda: 1 / 0, 1)
    n = []

    def flaky():
        n.append(1)
        if len(n) < 3:
            raise OSError("not yet")
        return True

    assert poll("flaky", flaky, 5, errors_are_not_yet=True)
