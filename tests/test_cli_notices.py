"""Our own warnings reach the user as one ``minivllm: warning: ...`` line each (once per text);
other libraries' warnings keep Python's form."""

from __future__ import annotations

import warnings

from runtime.cli.notices import as_notices

OurWarning = type("OurWarning", (UserWarning,), {"__module__": "traces.log"})


def test_our_warnings_are_one_line_notices_once_each(capsys):
    with as_notices():
        for _ in range(2):
            warnings.warn("run.jsonl: dropped the last 12 bytes", OurWarning, stacklevel=1)
            warnings.warn("other.jsonl: dropped the last 3 bytes", OurWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert err == ("minivllm: warning: run.jsonl: dropped the last 12 bytes\n"
                   "minivllm: warning: other.jsonl: dropped the last 3 bytes\n")


def test_other_warnings_go_to_the_previous_hook(capsys):
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, *rest: seen.append((str(message), category))
        with as_notices():
            warnings.warn("a library's own", RuntimeWarning, stacklevel=1)
    assert seen == [("a library's own", RuntimeWarning)]
    assert "minivllm: warning" not in capsys.readouterr().err
