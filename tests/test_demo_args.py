"""``vllm-specext demo`` refuses bad arguments before it starts any engine."""
from __future__ import annotations

import pytest

from vllm_specext import demo


@pytest.mark.parametrize("argv, message", [
    (["--methods", "bogus"], "--methods bogus: unknown speculative method 'bogus'"),
    (["--methods", ","], "name at least one method"),
    (["-k", "0"], "must be >= 1, got 0"),
    (["--max-tokens", "0"], "must be >= 1, got 0"),
    (["--batch-size", "-1"], "must be >= 1, got -1"),
    (["--batch-size", "two"], "expected an integer >= 1"),
])
def test_bad_arguments_are_usage_errors(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(demo, "run_demo", lambda *a: pytest.fail("an engine was started"))
    with pytest.raises(SystemExit) as exit_info:
        demo.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
