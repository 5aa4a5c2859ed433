"""The server's options are one :class:`setdlm.serve.ServeOptions`, checked once when it is made: a bad value
is one ``UserError`` naming its field (the command line: one line naming the flag, before the model loads);
``serve``, ``create_app`` and the batcher take it as it is."""

import dataclasses

import pytest

from setdlm.errors import UserError
from setdlm.serve import ServeOptions
from setdlm.serve.guard import LOOPBACK_HOSTS

from support import assert_one_line_error, run

BAD = [("host", ""), ("port", 70000), ("port", -1), ("port", 80.0), ("max_batch", 0), ("max_batch", True),
       ("max_queue", -1), ("timeout", 0), ("timeout", float("nan")), ("max_body_mb", 0), ("max_body_mb", "4"),
       ("allow_hosts", "box.lan"), ("allow_hosts", ("",)), ("grace", -1), ("grace", float("inf"))]


@pytest.mark.parametrize("name, value", BAD)
def test_each_bad_value_is_one_error_naming_its_field(name, value):
    with pytest.raises(UserError) as e:
        ServeOptions(**{name: value})
    assert str(e.value).startswith(f"{name} ") and e.value.fields == (name,) and repr(value) in str(e.value)


def test_good_values_and_what_follows_from_them():
    o = ServeOptions(max_queue=0, grace=0, max_body_mb=0.5, allow_hosts=("Box.LAN",))
    assert o.max_body == 2**19 and o.allowed_hosts == (*LOOPBACK_HOSTS, "box.lan")
    assert ServeOptions(host="0.0.0.0").allowed_hosts is None  # bound beyond loopback: any Host
    with pytest.raises(dataclasses.FrozenInstanceError):  # checked once: it cannot change afterwards
        o.max_batch = 0


@pytest.mark.parametrize("flags, needle", [
    (["--max-batch", "0"], "--max-batch must be >= 1, got 0"),
    (["--max-queue", "-1"], "--max-queue must be >= 0, got -1"),
    (["--timeout", "0"], "--timeout must be > 0 seconds, got 0.0"),
    (["--max-body-mb", "-2"], "--max-body-mb must be > 0 (MiB), got -2.0"),
    (["--grace", "-1"], "--grace must be a number of seconds >= 0, got -1.0"),
    (["--port", "70000"], "--port must be an integer in [0, 65535], got 70000"),
    (["--allow-host", ""], "--allow-hosts must be a tuple of host names, got ('',)"),  # the flag's other spelling
])
def test_the_command_line_names_the_flag_before_the_model_loads(flags, needle, capsys):
    code, _, err = run(["serve", "./no-such-model", *flags], capsys)  # the model is never read
    assert_one_line_error(code, err, needle)
