"""Error messages of one framework's own states (the backend-neutral messages are in
unihook/conformance/test_error_messages.py)."""

from __future__ import annotations

import unihook
from unihook.conformance import kit
from unihook.conformance.test_error_messages import NAME, _names, _raises, _x


def test_second_backward_through_hooked_layer() -> None:
    """paddle only: a second Tensor.backward through a PyLayer segfaults paddle 3.3.1."""
    paddle = kit("paddle")
    m = paddle.linear(3, 2)
    unihook.register_full_backward_hook(m, lambda *a: None, name=NAME)
    y = m(_x(paddle)).sum()
    paddle.backward(y, retain_graph=True)
    error = _raises(lambda: paddle.backward(y), unihook.BackendStateError, RuntimeError)
    _names(error, "full_backward", f"'{NAME}'", "paddle", "expected one Tensor.backward")
